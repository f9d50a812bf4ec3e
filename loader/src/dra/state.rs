//! What the plugin has prepared: the CDI spec, the claim's region
//! directory and a checkpoint entry per claim. The checkpoint
//! (`<state-dir>/dra-checkpoint.json`) is what makes a repeated prepare
//! after a restart answer the same, and tells the plugin's own leftovers
//! from claims it still serves.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cdi::{self, Layout};
use super::claim::Plan;

/// The checkpoint's file name under `--state-dir`.
pub const CHECKPOINT: &str = "dra-checkpoint.json";
/// A claim directory's mode: its containers' users all write there.
const CLAIM_DIR_MODE: u32 = 0o777;
/// Its format; a checkpoint of another version is refused, not guessed.
const CHECKPOINT_VERSION: u32 = 1;

/// One device of a prepared claim, as answered to kubelet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
}

/// One prepared claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    /// Claim UID -> what was prepared.
    claims: BTreeMap<String, Prepared>,
}

/// Why the plugin's files could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path} is not readable JSON")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("checkpoint {path} is version {found}; this vgpu reads version {CHECKPOINT_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("claim UID {uid:?} cannot name a CDI device or a file")]
    BadUid { uid: String },
    #[error(
        "the hook is not installed: no {path} (`vgpu install-hook` puts it there; \
         in deploy/overlays/dra the pod's init container does)"
    )]
    HookMissing { path: PathBuf },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateError {
    let path = path.to_owned();
    move |source| StateError::Io { what, path, source }
}

/// The plugin's prepared claims and the files that make them.
pub struct State {
    layout: Layout,
    cdi_dir: PathBuf,
    checkpoint_path: PathBuf,
    checkpoint: Checkpoint,
}

impl State {
    /// Loads the checkpoint (none yet: empty) and removes what a former run
    /// left that the checkpoint does not name: specs of this plugin's kind
    /// in `cdi_dir` and their claim directories. Returns the UIDs cleaned.
    pub fn open(
        layout: Layout,
        cdi_dir: PathBuf,
        state_dir: &Path,
    ) -> Result<(Self, Vec<String>), StateError> {
        std::fs::create_dir_all(state_dir).map_err(io("creating state directory", state_dir))?;
        let checkpoint_path = state_dir.join(CHECKPOINT);
        let checkpoint = match std::fs::read(&checkpoint_path) {
            Ok(b) => {
                let c: Checkpoint =
                    serde_json::from_slice(&b).map_err(|source| StateError::Parse {
                        path: checkpoint_path.clone(),
                        source,
                    })?;
                if c.version != CHECKPOINT_VERSION {
                    return Err(StateError::Version {
                        path: checkpoint_path,
                        found: c.version,
                    });
                }
                c
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Checkpoint {
                version: CHECKPOINT_VERSION,
                claims: BTreeMap::new(),
            },
            Err(e) => return Err(io("reading checkpoint", &checkpoint_path)(e)),
        };
        let mut state = State {
            layout,
            cdi_dir,
            checkpoint_path,
            checkpoint,
        };
        let cleaned = state.clean_orphans()?;
        Ok((state, cleaned))
    }

    /// Whether `file` in the CDI directory is one of this plugin's specs.
    pub fn is_own_spec(&self, file: &str) -> bool {
        self.layout.uid_of_spec(file).is_some()
    }

    /// The claims prepared, by UID.
    pub fn prepared(&self) -> impl Iterator<Item = (&String, &Prepared)> {
        self.checkpoint.claims.iter()
    }

    /// What was prepared for `uid`, if it was.
    pub fn get(&self, uid: &str) -> Option<&Prepared> {
        self.checkpoint.claims.get(uid)
    }

    /// Removes specs of this plugin's kind whose claim is not checkpointed.
    fn clean_orphans(&mut self) -> Result<Vec<String>, StateError> {
        let entries = match std::fs::read_dir(&self.cdi_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing CDI directory", &self.cdi_dir)(e)),
        };
        let mut cleaned = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(uid) = name.to_str().and_then(|n| self.layout.uid_of_spec(n)) else {
                continue;
            };
            if self.checkpoint.claims.contains_key(&uid) {
                continue;
            }
            self.remove_files(&uid)?;
            cleaned.push(uid);
        }
        Ok(cleaned)
    }

    /// Writes the spec, the claim directory and the checkpoint entry for
    /// `plan`; on any failure, removes what it wrote, so the node is as
    /// before. Already prepared: the answer kept.
    pub fn prepare(&mut self, plan: &Plan) -> Result<Prepared, StateError> {
        if let Some(p) = self.checkpoint.claims.get(&plan.uid) {
            return Ok(p.clone());
        }
        if !cdi::valid_name(&plan.uid) {
            return Err(StateError::BadUid {
                uid: plan.uid.clone(),
            });
        }
        // A spec naming a file the host lacks would fail the container at
        // start, far from the cause: refuse the claim here instead.
        for file in [cdi::HOOK_LIB, cdi::PRELOAD_FILE] {
            let path = self.layout.hook_dir.join(file);
            if !path.is_file() {
                return Err(StateError::HookMissing { path });
            }
        }
        let spec = self.layout.spec(plan);
        let spec_path = self.layout.spec_path(&self.cdi_dir, &plan.uid);
        let json = serde_json::to_vec_pretty(&spec).map_err(|source| StateError::Parse {
            path: spec_path.clone(),
            source,
        })?;
        // The spec first: where the CDI directory cannot be written,
        // nothing else is made (not even `claims/`). No container uses the
        // spec before kubelet has the answer, so the directory may follow.
        write_atomic(&spec_path, &json)?;
        let claim_dir = self.layout.claim_dir(&plan.uid);
        // The claim's containers may run as any user, and their hook
        // creates the region file here: anyone may write (as HAMi's
        // device plugin makes its region directories). Only the claim's
        // containers mount it.
        let made = std::fs::create_dir_all(&claim_dir).and_then(|()| {
            std::fs::set_permissions(&claim_dir, std::fs::Permissions::from_mode(CLAIM_DIR_MODE))
        });
        if let Err(e) = made {
            let _ = std::fs::remove_file(&spec_path);
            let _ = std::fs::remove_dir_all(&claim_dir);
            return Err(io("creating claim directory", &claim_dir)(e));
        }
        let id = self.layout.device_id(&plan.uid);
        let prepared = Prepared {
            namespace: plan.namespace.clone(),
            name: plan.name.clone(),
            devices: plan
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| PreparedDevice {
                    requests: d.requests.clone(),
                    pool: d.pool.clone(),
                    device: d.device.clone(),
                    // NVIDIA's first: the runtime applies the devices in
                    // order, so where both set a variable
                    // (NVIDIA_VISIBLE_DEVICES) the claim's value stays.
                    cdi_ids: plan
                        .nvidia
                        .as_ref()
                        .and_then(|n| n.get(i).cloned())
                        .into_iter()
                        .chain([id.clone()])
                        .collect(),
                })
                .collect(),
        };
        self.checkpoint
            .claims
            .insert(plan.uid.clone(), prepared.clone());
        if let Err(e) = self.save() {
            self.checkpoint.claims.remove(&plan.uid);
            let _ = std::fs::remove_file(&spec_path);
            let _ = std::fs::remove_dir_all(&claim_dir);
            return Err(e);
        }
        Ok(prepared)
    }

    /// Removes the claim's spec, directory and checkpoint entry; a claim
    /// never prepared (or already unprepared) is no error.
    pub fn unprepare(&mut self, uid: &str) -> Result<(), StateError> {
        if !cdi::valid_name(uid) {
            return Err(StateError::BadUid {
                uid: uid.to_owned(),
            });
        }
        self.remove_files(uid)?;
        if self.checkpoint.claims.remove(uid).is_some() {
            self.save()?;
        }
        Ok(())
    }

    fn remove_files(&self, uid: &str) -> Result<(), StateError> {
        let spec = self.layout.spec_path(&self.cdi_dir, uid);
        match std::fs::remove_file(&spec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing CDI spec", &spec)(e)),
        }
        let dir = self.layout.claim_dir(uid);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("removing claim directory", &dir)(e)),
        }
    }

    fn save(&self) -> Result<(), StateError> {
        let json =
            serde_json::to_vec_pretty(&self.checkpoint).map_err(|source| StateError::Parse {
                path: self.checkpoint_path.clone(),
                source,
            })?;
        write_atomic(&self.checkpoint_path, &json)
    }
}

/// Writes `path` through a temporary file beside it and a rename, so a
/// reader (a container runtime reading the CDI directory) never sees half.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("writing", path)(e)
    })
}
