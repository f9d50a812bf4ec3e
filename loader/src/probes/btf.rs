//! Kernel struct offsets from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! aya's Rust programs have no CO-RE field relocations, so the loader reads
//! the few offsets the programs need and passes them as a global. This is a
//! minimal BTF reader (types and strings sections only) written for that:
//! aya-obj's BTF type lookups are crate-private, and btf-rs is LGPL.

use std::{collections::HashMap, path::Path};

use vgpu_common::event::KernelOffsets;

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Reading kernel offsets failed.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The BTF file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The data is not BTF this reader understands.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// A struct the probes need is not in the kernel's BTF.
    #[error("kernel BTF has no struct {0}")]
    NoStruct(&'static str),
    /// A member the probes need is not in the struct.
    #[error("kernel BTF struct {strukt} has no member {member}")]
    NoMember {
        /// Struct name.
        strukt: &'static str,
        /// Member name.
        member: &'static str,
    },
}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    ty: u32,
    /// Bit offset.
    offset_bits: u32,
}

#[derive(Clone, Debug)]
struct Type {
    name: u32,
    kind: u32,
    /// `size` for int/struct/union/enum/float, `type` for ptr/typedef/modifiers.
    size_or_type: u32,
    members: Vec<Member>,
    /// (element type, count) for arrays.
    array: Option<(u32, u32)>,
}

/// A parsed BTF blob: types by id (id 0 is `void`) and the string section.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    structs: HashMap<String, u32>,
}

fn u32_at(d: &[u8], off: usize) -> Result<u32, BtfError> {
    d.get(off..off + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(BtfError::Malformed("truncated"))
}

impl Btf {
    /// Reads and parses a BTF file.
    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Btf::parse(&data)
    }

    /// Parses little-endian BTF.
    pub fn parse(d: &[u8]) -> Result<Btf, BtfError> {
        let magic = d.get(0..2).ok_or(BtfError::Malformed("empty"))?;
        if magic != [0x9f, 0xeb] {
            return Err(BtfError::Malformed("bad magic (or big-endian)"));
        }
        let hdr_len = u32_at(d, 4)? as usize;
        let type_off = u32_at(d, 8)? as usize;
        let type_len = u32_at(d, 12)? as usize;
        let str_off = u32_at(d, 16)? as usize;
        let str_len = u32_at(d, 20)? as usize;
        let types_sec = d
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = d
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();
        let mut types = vec![Type {
            name: 0,
            kind: 0,
            size_or_type: 0,
            members: Vec::new(),
            array: None,
        }];
        let mut off = 0;
        while off < types_sec.len() {
            let name = u32_at(types_sec, off)?;
            let info = u32_at(types_sec, off + 4)?;
            let size_or_type = u32_at(types_sec, off + 8)?;
            off += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kflag = info >> 31 == 1;
            let mut t = Type {
                name,
                kind,
                size_or_type,
                members: Vec::new(),
                array: None,
            };
            match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => off += 4,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => {}
                KIND_ARRAY => {
                    t.array = Some((u32_at(types_sec, off)?, u32_at(types_sec, off + 8)?));
                    off += 12;
                }
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = off + i * 12;
                        let raw = u32_at(types_sec, m + 8)?;
                        t.members.push(Member {
                            name: u32_at(types_sec, m)?,
                            ty: u32_at(types_sec, m + 4)?,
                            offset_bits: if kflag { raw & 0x00ff_ffff } else { raw },
                        });
                    }
                    off += vlen * 12;
                }
                KIND_ENUM | KIND_FUNC_PROTO => off += vlen * 8,
                KIND_DATASEC | KIND_ENUM64 => off += vlen * 12,
                _ => return Err(BtfError::Malformed("unknown type kind")),
            }
            types.push(t);
        }
        let mut btf = Btf {
            types,
            strings,
            structs: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_STRUCT && t.name != 0 {
                let name = btf.str_at(t.name).to_owned();
                // The first definition wins (duplicates are identical in vmlinux).
                btf.structs.entry(name).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn str_at(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    fn ty(&self, id: u32) -> Option<&Type> {
        self.types.get(id as usize)
    }

    /// Follows typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Option<&Type> {
        for _ in 0..32 {
            let t = self.ty(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type;
                }
                _ => return Some(t),
            }
        }
        None
    }

    /// Size in bytes of a type.
    fn size_of(&self, id: u32) -> Option<u32> {
        let t = self.resolve(id)?;
        match t.kind {
            KIND_PTR => Some(8),
            KIND_ARRAY => {
                let (elem, n) = t.array?;
                Some(self.size_of(elem)? * n)
            }
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT => {
                Some(t.size_or_type)
            }
            _ => None,
        }
    }

    /// Byte offset of `member` in struct/union type `id`, looking through
    /// anonymous struct/union members.
    fn member_in(&self, id: u32, member: &str) -> Option<(u32, u32)> {
        let t = self.resolve(id)?;
        for m in &t.members {
            if m.name == 0 {
                if let Some((off, ty)) = self.member_in(m.ty, member) {
                    return Some((m.offset_bits / 8 + off, ty));
                }
            } else if self.str_at(m.name) == member {
                return Some((m.offset_bits / 8, m.ty));
            }
        }
        None
    }

    /// `offsetof(struct strukt, member)` and the member's type id.
    pub fn member(
        &self,
        strukt: &'static str,
        member: &'static str,
    ) -> Result<(u32, u32), BtfError> {
        let id = *self.structs.get(strukt).ok_or(BtfError::NoStruct(strukt))?;
        self.member_in(id, member)
            .ok_or(BtfError::NoMember { strukt, member })
    }

    /// `sizeof(struct strukt)`.
    pub fn struct_size(&self, strukt: &'static str) -> Result<u32, BtfError> {
        let id = *self.structs.get(strukt).ok_or(BtfError::NoStruct(strukt))?;
        self.size_of(id)
            .ok_or(BtfError::Malformed("struct without size"))
    }
}

/// The offsets the probes need to find a task's namespace pids.
pub fn kernel_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let off = |s, m| btf.member(s, m).map(|(o, _)| o);
    Ok(KernelOffsets {
        task_thread_pid: off("task_struct", "thread_pid")?,
        task_group_leader: off("task_struct", "group_leader")?,
        pid_level: off("pid", "level")?,
        pid_numbers: off("pid", "numbers")?,
        upid_size: btf.struct_size("upid")?,
        upid_nr: off("upid", "nr")?,
        upid_ns: off("upid", "ns")?,
        pidns_inum: off("pid_namespace", "ns")? + off("ns_common", "inum")?,
    })
}

/// Reads [`kernel_offsets`] from the running kernel.
pub fn running_kernel_offsets() -> Result<KernelOffsets, BtfError> {
    kernel_offsets(&Btf::from_file(Path::new(VMLINUX_BTF))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_kernel_has_the_offsets() {
        if !Path::new(VMLINUX_BTF).exists() {
            return;
        }
        let o = running_kernel_offsets().unwrap();
        assert_eq!(
            o.upid_size, 16,
            "struct upid is {{ int nr; struct pid_namespace *ns; }}"
        );
        assert_eq!(o.upid_nr, 0);
        assert_eq!(o.upid_ns, 8);
        assert!(o.task_thread_pid > 0 && o.task_group_leader > 0);
    }
}
