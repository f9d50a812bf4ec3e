//! `cargo xtask release`: one installable bundle per architecture, for a
//! cluster that pulls from no public registry (docs/kubernetes.md, "From a
//! release bundle").
//!
//! ```text
//! target/release-bundle/vgpu-<version>-<arch>/
//!   bin/vgpu  lib/libvgpu.so        the release files of target/dist[-<arch>]
//!   share/                          completions and man pages
//!   image/vgpu-<version>-<arch>.tar the image, a docker-archive tar named
//!                                   <registry>/vgpu:<version>
//!   deploy/                         the Kustomize tree, the overlays naming that image
//!   manifests/<overlay>.yaml        each overlay rendered by `kubectl kustomize`
//!   sbom.cdx.json                   CycloneDX SBOM of the shipped crates
//!   LICENSE-* README.md CHANGELOG.md
//!   docs/runbooks.md                what the alerts' runbook_url names
//!   SHA256SUMS                      over every other file
//! target/release-bundle/vgpu-<version>-<arch>.tar.gz
//! ```
//!
//! The version is the workspace's (`[workspace.package] version`, which
//! xtask inherits): the binaries, the image tag and the manifests all take
//! it from there.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::arch::Arch;
use crate::{build, util};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The overlays rendered into `manifests/`.
const OVERLAYS: &[&str] = &["hami", "standalone", "dra"];

/// What of `deploy/` ships: the Kustomize tree and the dashboard (the image
/// build scripts are for building, not installing).
const DEPLOY_DIRS: &[&str] = &["base", "components", "overlays", "grafana"];

const DOCS: &[&str] = &[
    "README.md",
    "CHANGELOG.md",
    "LICENSE-MIT",
    "LICENSE-APACHE",
    "LICENSE-GPL-2.0",
    // The alerts' runbook_url (deploy/components/prometheusrule) points here.
    "docs/runbooks.md",
];

/// The SBOM describes what ships, not the test and developer crates: the
/// loader (with `vgpu-common` and the eBPF crate it embeds) and the hook.
const SBOM_ROOT: &str = "vgpu-loader";
const SBOM_ALSO: &[&str] = &["vgpu-hook"];

#[derive(clap::Args)]
pub struct Args {
    /// An architecture to bundle; repeat it for several (default: this
    /// machine's).
    #[arg(long = "arch", value_enum)]
    pub arches: Vec<Arch>,
    /// Every architecture (x86_64 and aarch64).
    #[arg(long, conflicts_with = "arches")]
    pub all_arches: bool,
    /// Where the nodes pull the image from: the bundle's image and
    /// manifests name `<registry>/vgpu:<version>`.
    #[arg(long, default_value = "localhost")]
    pub registry: String,
    /// Bundle what `cargo xtask build [--arch]` already left in
    /// target/dist[-<arch>] instead of building first.
    #[arg(long)]
    pub no_build: bool,
    /// The output directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask release builds the image with buildah as root; run it as root");
    }
    let arches = Arch::selected(&args.arches, args.all_arches);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| util::target_dir().join("release-bundle"));
    fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let image = format!("{}/vgpu:{VERSION}", args.registry.trim_end_matches('/'));
    for arch in arches {
        let dist = if args.no_build {
            arch.dist_dir()
        } else {
            build::run(&build::Args {
                arch: Some(arch),
                ..build::Args::default()
            })?
        };
        let tarball = bundle(arch, &dist, &image, &out)?;
        eprintln!("release: {} (image {image})", tarball.display());
    }
    Ok(())
}

/// Writes `out/vgpu-<version>-<arch>/` and its `.tar.gz`; returns the latter.
fn bundle(arch: Arch, dist: &Path, image: &str, out: &Path) -> Result<PathBuf> {
    check_dist(arch, dist)?;
    let name = format!("vgpu-{VERSION}-{}", arch.name());
    let dir = out.join(&name);
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    for sub in ["bin", "lib", "image", "deploy", "manifests", "docs"] {
        fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("create {}/{sub}", dir.display()))?;
    }
    copy(&dist.join("vgpu"), &dir.join("bin/vgpu"))?;
    copy(&dist.join("libvgpu.so"), &dir.join("lib/libvgpu.so"))?;
    copy(&dist.join("share"), &dir.join("share"))?;
    for doc in DOCS {
        copy(&util::root().join(doc), &dir.join(doc))?;
    }
    for sub in DEPLOY_DIRS {
        copy(
            &util::root().join("deploy").join(sub),
            &dir.join("deploy").join(sub),
        )?;
    }
    for overlay in OVERLAYS {
        let k = dir.join("deploy/overlays").join(overlay);
        set_image(&k.join("kustomization.yaml"), image)?;
        let rendered = util::output_checked(Command::new("kubectl").arg("kustomize").arg(&k))?;
        if !rendered.contains(&format!("image: {image}\n")) {
            bail!("{overlay}: the rendered manifests do not name {image}");
        }
        let file = dir.join("manifests").join(format!("{overlay}.yaml"));
        fs::write(&file, rendered + "\n").with_context(|| format!("write {}", file.display()))?;
    }
    image_archive(
        arch,
        dist,
        image,
        &dir.join("image").join(format!("{name}.tar")),
    )?;
    sbom(arch, &dir.join("sbom.cdx.json"))?;
    checksums(&dir)?;
    let tarball = out.join(format!("{name}.tar.gz"));
    // Sorted names and root ownership: the archive's listing does not
    // depend on the build machine's directory order or users.
    util::run(
        Command::new("tar")
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-czf",
            ])
            .arg(&tarball)
            .arg("-C")
            .arg(out)
            .arg(&name),
    )?;
    Ok(tarball)
}

/// The dist must be complete and of this version: a dist left by an older
/// checkout would ship binaries that disagree with the bundle's name.
fn check_dist(arch: Arch, dist: &Path) -> Result<()> {
    for f in ["vgpu", "libvgpu.so", "share/man/man1/vgpu.1"] {
        if !dist.join(f).exists() {
            bail!(
                "{} is missing: run `cargo xtask build --arch {}` first",
                dist.join(f).display(),
                arch.name()
            );
        }
    }
    let said = util::output_checked(arch.command(&dist.join("vgpu")).arg("--version"))?;
    if !said.starts_with(&format!("vgpu {VERSION} ")) {
        bail!(
            "{} says `{said}`, not version {VERSION}: rebuild it",
            dist.display()
        );
    }
    Ok(())
}

/// Points the overlay's `images:` entry and version label at `image`: the
/// overlays name the default bundle's image, `localhost/vgpu:<version>`
/// (`newName:`, `newTag:`, the `app.kubernetes.io/version` label), each
/// exactly once; `--registry` changes the name.
fn set_image(kustomization: &Path, image: &str) -> Result<()> {
    let (repo, tag) = image
        .rsplit_once(':')
        .with_context(|| format!("{image}: no tag"))?;
    let text = fs::read_to_string(kustomization)
        .with_context(|| format!("read {}", kustomization.display()))?;
    let mut seen = [0; 3];
    let keys = [
        ("newName:", repo.to_owned()),
        ("newTag:", tag.to_owned()),
        ("app.kubernetes.io/version:", format!("\"{VERSION}\"")),
    ];
    let mut edited = String::new();
    for line in text.lines() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        match keys.iter().position(|(k, _)| body.starts_with(k)) {
            Some(i) => {
                seen[i] += 1;
                edited.push_str(&format!("{indent}{} {}\n", keys[i].0, keys[i].1));
            }
            None => {
                edited.push_str(line);
                edited.push('\n');
            }
        }
    }
    if seen != [1; 3] {
        bail!(
            "{}: expected one each of newName, newTag and the version label, found {seen:?}",
            kustomization.display()
        );
    }
    fs::write(kustomization, edited).with_context(|| format!("write {}", kustomization.display()))
}

/// Builds the image (deploy/image/build.sh) and saves it as a docker-archive
/// tar named `image`. Both `podman load` and `ctr -n k8s.io images import`
/// (containerd 1.6.20, Debian 12's) also take buildah's oci-archive under
/// the name given; docker-archive because its `manifest.json` names the
/// image by its full reference whatever wrote it, while ctr names an OCI
/// archive after its `org.opencontainers.image.ref.name` annotation, which
/// some tools fill with the tag alone; and Docker before 25 loads only
/// docker-archive.
fn image_archive(arch: Arch, dist: &Path, image: &str, archive: &Path) -> Result<()> {
    let oci = match arch {
        Arch::X86_64 => "amd64",
        Arch::Aarch64 => "arm64",
    };
    // Built under a name of its own, so that bundling both architectures
    // does not retag one's image as the other's.
    let local = format!("{image}-release-{oci}");
    let stage = util::target_dir()
        .join("image")
        .join(format!("release-{oci}"));
    util::run(
        Command::new("sh")
            .arg(util::root().join("deploy/image/build.sh"))
            .arg(dist)
            .arg(&local)
            .arg(&stage)
            .arg(arch.name()),
    )?;
    // Pushed by its ID: pushed by name, the archive would list that
    // build-only name beside `image`, and `podman load` would tag both.
    let pushed = util::output_checked(Command::new("buildah").args([
        "images",
        "--quiet",
        "--no-trunc",
        &local,
    ]))
    .and_then(|id| {
        util::run(
            Command::new("buildah")
                .args(["push", "--quiet", id.trim()])
                .arg(format!("docker-archive:{}:{image}", archive.display())),
        )
    });
    let _ = util::output(Command::new("buildah").args(["rmi", &local]));
    pushed
}

/// A CycloneDX SBOM of the shipped code for this architecture's target, by
/// cargo-cyclonedx (`cargo xtask setup`). It writes one document per
/// workspace crate, beside its manifest; those are removed, and the
/// loader's (which lists the eBPF crate it embeds and `vgpu-common`) is
/// merged with the hook's into one.
fn sbom(arch: Arch, to: &Path) -> Result<()> {
    let name = format!("vgpu-sbom-{}", std::process::id());
    let mut cmd = util::cargo();
    cmd.args([
        "cyclonedx",
        "--quiet",
        "--format",
        "json",
        "--spec-version",
        "1.5",
        "--all-features",
        "--target",
    ])
    .arg(arch.gnu_target())
    .args(["--override-filename", &name]);
    // The commit's time, not now: the same commit gives the same SBOM.
    if let Some(t) = util::output(Command::new("git").args(["log", "-1", "--format=%ct"])) {
        cmd.env("SOURCE_DATE_EPOCH", t);
    }
    let ran = util::run(&mut cmd);
    let mut docs = BTreeMap::new();
    for member in workspace_dirs()? {
        let f = member.join(format!("{name}.json"));
        if let Ok(text) = fs::read_to_string(&f) {
            let _ = fs::remove_file(&f);
            let doc: Value =
                serde_json::from_str(&text).with_context(|| format!("parse {}", f.display()))?;
            if let Some(crate_name) = doc["metadata"]["component"]["name"].as_str() {
                docs.insert(crate_name.to_owned(), doc);
            }
        }
    }
    ran?;
    let mut merged = docs
        .remove(SBOM_ROOT)
        .with_context(|| format!("cargo cyclonedx wrote no SBOM for {SBOM_ROOT}"))?;
    for c in SBOM_ALSO {
        let doc = docs
            .remove(*c)
            .with_context(|| format!("cargo cyclonedx wrote no SBOM for {c}"))?;
        merge_sbom(&mut merged, doc)?;
    }
    let text = serde_json::to_string_pretty(&merged)?;
    fs::write(to, text + "\n").with_context(|| format!("write {}", to.display()))
}

/// Adds `doc`'s crate and its components to `into`'s components, and its
/// dependency graph to `into`'s, each entry once (by `bom-ref`/`ref`).
fn merge_sbom(into: &mut Value, doc: Value) -> Result<()> {
    let mut add = vec![doc["metadata"]["component"].clone()];
    add.extend(doc["components"].as_array().cloned().unwrap_or_default());
    let comps = into["components"]
        .as_array_mut()
        .context("SBOM without components")?;
    for c in add {
        if !comps.iter().any(|x| x["bom-ref"] == c["bom-ref"]) {
            comps.push(c);
        }
    }
    if let (Some(deps), Some(more)) = (
        into["dependencies"].as_array_mut(),
        doc["dependencies"].as_array(),
    ) {
        for d in more {
            if !deps.iter().any(|x| x["ref"] == d["ref"]) {
                deps.push(d.clone());
            }
        }
    }
    Ok(())
}

fn workspace_dirs() -> Result<Vec<PathBuf>> {
    let meta: Value = serde_json::from_str(&util::output_checked(util::cargo().args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?)?;
    Ok(meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["manifest_path"].as_str())
        .filter_map(|p| Path::new(p).parent().map(Path::to_path_buf))
        .collect())
}

/// `SHA256SUMS` over every file of the bundle, by path relative to it, so
/// `sha256sum -c SHA256SUMS` checks it from inside.
fn checksums(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    let sums = util::output_checked(
        Command::new("sha256sum")
            .arg("--")
            .args(&files)
            .current_dir(dir),
    )?;
    let file = dir.join("SHA256SUMS");
    fs::write(&file, sums + "\n").with_context(|| format!("write {}", file.display()))
}

fn walk(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk(root, &path, files)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            files.push(rel.to_path_buf());
        }
    }
    Ok(())
}

/// `cp -R`: a file or a whole directory.
fn copy(from: &Path, to: &Path) -> Result<()> {
    util::run(Command::new("cp").arg("-R").arg(from).arg(to))
}
