//! Modules, libraries and functions. Loading accepts any image; a function
//! named `busy_<N>us` / `busy_<N>ns` / `busy_<N>ms` lasts exactly that long.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

use crate::state::{with, Driver};
use crate::{cstr, guard, put, CUdeviceptr, CUresult, CuErr, Handle};

/// A kernel function.
#[derive(Debug, Clone)]
pub(crate) struct Func {
    pub name: CString,
    /// Duration from the name, if it encodes one.
    pub name_ns: Option<u64>,
}

impl Driver {
    fn load_module(&mut self) -> Result<Handle, CuErr> {
        let (ctx, dev) = self.current_ctx()?;
        // GPU code takes device memory that no allocation call passes
        // through (lazily loaded kernels, their constants): per module.
        let bytes = std::env::var("SIMGPU_MODULE_BYTES")
            .ok()
            .and_then(|v| simgpu::config::parse_size(&v).ok())
            .unwrap_or(0);
        self.charge(dev, bytes)?;
        let h = self.new_handle();
        self.modules.insert(h, Vec::new());
        if bytes > 0 {
            self.module_mem.insert(h, (ctx, dev, bytes));
        }
        Ok(h)
    }

    /// Gets (or creates) the function `name` of module `m`.
    pub(crate) fn get_function(&mut self, m: Handle, name: &str) -> Result<Handle, CuErr> {
        let funcs = self.modules.get(&m).ok_or(CuErr::InvalidHandle)?.clone();
        if let Some(&f) = funcs.iter().find(|f| {
            self.funcs
                .get(f)
                .is_some_and(|x| x.name.to_bytes() == name.as_bytes())
        }) {
            return Ok(f);
        }
        let h = self.new_handle();
        self.funcs.insert(
            h,
            Func {
                name: CString::new(name).map_err(|_| CuErr::InvalidValue)?,
                name_ns: simgpu::model::duration_from_name(name),
            },
        );
        if let Some(v) = self.modules.get_mut(&m) {
            v.push(h);
        }
        Ok(h)
    }

    fn unload_module(&mut self, m: Handle) -> Result<(), CuErr> {
        let funcs = self.modules.remove(&m).ok_or(CuErr::InvalidHandle)?;
        if let Some((_, dev, bytes)) = self.module_mem.remove(&m) {
            self.uncharge(dev, bytes);
        }
        for f in funcs {
            self.funcs.remove(&f);
        }
        Ok(())
    }
}

fn load(m: *mut Handle) -> Result<(), CuErr> {
    if m.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let h = with(|d| d.load_module())?;
    put!(m, h);
    Ok(())
}

/// `cuModuleLoad`: any file name is accepted (the file is not read).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(m: *mut Handle, fname: *const c_char) -> CUresult {
    guard(|| {
        let _ = cstr!(fname);
        load(m)
    })
}

/// `cuModuleLoadData`: any image.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut Handle, image: *const c_void) -> CUresult {
    guard(|| {
        if image.is_null() {
            return Err(CuErr::InvalidValue);
        }
        load(m)
    })
}

/// `cuModuleLoadDataEx`: any image; JIT options ignored.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    m: *mut Handle,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        if image.is_null() {
            return Err(CuErr::InvalidValue);
        }
        load(m)
    })
}

/// `cuModuleLoadFatBinary`: any image.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(m: *mut Handle, image: *const c_void) -> CUresult {
    guard(|| {
        if image.is_null() {
            return Err(CuErr::InvalidValue);
        }
        load(m)
    })
}

/// `cuModuleUnload`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(m: Handle) -> CUresult {
    guard(|| with(|d| d.unload_module(m)))
}

/// `cuModuleGetFunction`: any name exists; `busy_<N>us|ns|ms` sets the
/// kernel's duration.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut Handle,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let name = cstr!(name);
        if f.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let h = with(|d| d.get_function(m, name))?;
        put!(f, h);
        Ok(())
    })
}

/// `cuModuleGetGlobal_v2`: every global exists and is 8 bytes.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let _ = cstr!(name);
        let p = with(|d| {
            if !d.modules.contains_key(&m) {
                return Err(CuErr::InvalidHandle);
            }
            Ok(d.new_addr(8))
        })?;
        if !dptr.is_null() {
            put!(dptr, p);
        }
        if !bytes.is_null() {
            put!(bytes, 8);
        }
        Ok(())
    })
}

fn load_library(lib: *mut Handle) -> Result<(), CuErr> {
    if lib.is_null() {
        return Err(CuErr::InvalidValue);
    }
    let h = with(|d| {
        let m = d.load_module()?;
        let h = d.new_handle();
        d.libraries.insert(h, m);
        Ok(h)
    })?;
    put!(lib, h);
    Ok(())
}

/// `cuLibraryLoadData`: any image; options ignored.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut Handle,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    guard(|| {
        if code.is_null() {
            return Err(CuErr::InvalidValue);
        }
        load_library(lib)
    })
}

/// `cuLibraryLoadFromFile`: any file name.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    lib: *mut Handle,
    file: *const c_char,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    guard(|| {
        let _ = cstr!(file);
        load_library(lib)
    })
}

/// `cuLibraryUnload`.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryUnload(lib: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            let m = d.libraries.remove(&lib).ok_or(CuErr::InvalidHandle)?;
            d.unload_module(m)
        })
    })
}

/// `cuLibraryGetModule`.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(m: *mut Handle, lib: Handle) -> CUresult {
    guard(|| {
        let h = with(|d| d.libraries.get(&lib).copied().ok_or(CuErr::InvalidHandle))?;
        put!(m, h);
        Ok(())
    })
}

/// `cuLibraryGetKernel`: a `CUkernel` is usable wherever a `CUfunction` is.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    k: *mut Handle,
    lib: Handle,
    name: *const c_char,
) -> CUresult {
    guard(|| {
        let name = cstr!(name);
        if k.is_null() {
            return Err(CuErr::InvalidValue);
        }
        let h = with(|d| {
            let m = d.libraries.get(&lib).copied().ok_or(CuErr::InvalidHandle)?;
            d.get_function(m, name)
        })?;
        put!(k, h);
        Ok(())
    })
}

/// `cuKernelGetFunction`: the same handle.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut Handle, k: Handle) -> CUresult {
    guard(|| {
        with(|d| {
            d.current_ctx()?;
            d.funcs.get(&k).map(|_| ()).ok_or(CuErr::InvalidHandle)
        })?;
        put!(f, k);
        Ok(())
    })
}

/// `cuFuncGetName`.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: Handle) -> CUresult {
    guard(|| {
        // The CString lives in the driver's table until the module unloads.
        let p = with(|d| Ok(d.funcs.get(&f).ok_or(CuErr::InvalidHandle)?.name.as_ptr()))?;
        put!(name, p);
        Ok(())
    })
}

/// `cuFuncGetAttribute`: plausible fixed values.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut c_int,
    attrib: c_int,
    f: Handle,
) -> CUresult {
    guard(|| {
        with(|d| d.funcs.get(&f).map(|_| ()).ok_or(CuErr::InvalidHandle))?;
        let v = match attrib {
            0 => 1024,   // MAX_THREADS_PER_BLOCK
            4 => 32,     // NUM_REGS
            5 | 6 => 90, // PTX_VERSION, BINARY_VERSION
            1..=3 | 7..=20 => 0,
            _ => return Err(CuErr::InvalidValue),
        };
        put!(value, v);
        Ok(())
    })
}

/// `cuFuncSetAttribute`: accepted.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: Handle, _attrib: c_int, _value: c_int) -> CUresult {
    guard(|| with(|d| d.funcs.get(&f).map(|_| ()).ok_or(CuErr::InvalidHandle)))
}

/// `cuFuncSetCacheConfig`: accepted.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetCacheConfig(f: Handle, _config: c_int) -> CUresult {
    guard(|| with(|d| d.funcs.get(&f).map(|_| ()).ok_or(CuErr::InvalidHandle)))
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`: `min(32, 2048 / blockSize)`.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    num_blocks: *mut c_int,
    f: Handle,
    block_size: c_int,
    _dynamic_smem: usize,
) -> CUresult {
    guard(|| {
        with(|d| d.funcs.get(&f).map(|_| ()).ok_or(CuErr::InvalidHandle))?;
        if block_size <= 0 {
            return Err(CuErr::InvalidValue);
        }
        put!(
            num_blocks,
            (simgpu::model::blocks_per_sm(block_size as u64)).min(32) as c_int
        );
        Ok(())
    })
}
