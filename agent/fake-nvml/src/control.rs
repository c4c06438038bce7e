//! Steering the loaded fake from Rust tests.
//!
//! A test binary that depends on this crate links the rlib, and
//! nvml-wrapper dlopens the cdylib: two copies of the code, each with its
//! own globals. Changing the rlib's globals would not reach the driver the
//! NVML source talks to, so these wrappers dlopen the same `.so` (the
//! dynamic loader hands back the copy already loaded) and call its exported
//! hooks `flopwatchFakeNvmlConfigure` and `flopwatchFakeNvmlSetTimeMs`.

use crate::config::{ConfigError, FakeConfig};
use std::ffi::{c_char, c_int, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Why the fake could not be steered.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// [`crate::library_path`] found no built library.
    #[error(
        "fake NVML library ({}) not found next to the executable",
        crate::library_file_name()
    )]
    NotBuilt,
    /// dlopen failed.
    #[error("cannot load {path}: {message}")]
    Load {
        /// The library tried.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The library lacks a hook (not the fake, or an old build).
    #[error("{path} does not export {symbol}: {message}")]
    Symbol {
        /// The library.
        path: PathBuf,
        /// The missing symbol.
        symbol: &'static str,
        /// The loader's message.
        message: String,
    },
    /// The spec does not parse.
    #[error("fake NVML spec: {0}")]
    Config(#[from] ConfigError),
    /// The library refused a spec this copy accepted (version skew).
    #[error("the fake NVML library rejected `{0}`")]
    Rejected(String),
}

type ConfigureFn = unsafe extern "C" fn(*const c_char) -> c_int;
type SetTimeFn = unsafe extern "C" fn(i64);

/// A handle on one loaded fake library.
pub struct Control {
    path: PathBuf,
    configure: ConfigureFn,
    set_time: SetTimeFn,
    // Keeps the library mapped while the function pointers above live.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").field("path", &self.path).finish()
    }
}

impl Control {
    /// Loads (or finds already loaded) the fake library at `path`.
    pub fn open(path: &Path) -> Result<Self, ControlError> {
        // SAFETY: loading runs the library's initializers; the fake is our
        // own Rust cdylib, whose initializers do nothing unsound.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| ControlError::Load {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let symbol = |name: &'static str, e: libloading::Error| ControlError::Symbol {
            path: path.to_path_buf(),
            symbol: name,
            message: e.to_string(),
        };
        // SAFETY: the fake exports these symbols with exactly these C
        // signatures (`exports.rs`); the pointers are used only while `_lib`
        // keeps the library loaded.
        let configure = unsafe { lib.get::<ConfigureFn>(b"flopwatchFakeNvmlConfigure\0") }
            .map(|s| *s)
            .map_err(|e| symbol("flopwatchFakeNvmlConfigure", e))?;
        // SAFETY: as above.
        let set_time = unsafe { lib.get::<SetTimeFn>(b"flopwatchFakeNvmlSetTimeMs\0") }
            .map(|s| *s)
            .map_err(|e| symbol("flopwatchFakeNvmlSetTimeMs", e))?;
        Ok(Self {
            path: path.to_path_buf(),
            configure,
            set_time,
            _lib: lib,
        })
    }

    /// The library this handle steers.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the simulated node (`FLOPWATCH_FAKE_NVML` syntax). The spec
    /// is checked here first, so a bad one yields a precise error.
    pub fn configure(&self, spec: &str) -> Result<(), ControlError> {
        FakeConfig::parse(spec)?;
        let c = CString::new(spec).map_err(|_| ControlError::Rejected(spec.to_string()))?;
        // SAFETY: `c` is a valid NUL-terminated string that outlives the
        // call; the hook only reads it.
        match unsafe { (self.configure)(c.as_ptr()) } {
            0 => Ok(()),
            _ => Err(ControlError::Rejected(spec.to_string())),
        }
    }

    /// Freezes the library's clock at `ms` (unix ms); 0 = wall clock.
    pub fn set_time_ms(&self, ms: i64) {
        // SAFETY: the hook takes a plain integer and touches only an atomic.
        unsafe { (self.set_time)(ms) }
    }
}

/// The library at [`crate::library_path`], loaded once per process and
/// never unloaded (so its state survives every other handle closing).
pub fn global() -> Result<&'static Control, ControlError> {
    static GLOBAL: OnceLock<Control> = OnceLock::new();
    if let Some(c) = GLOBAL.get() {
        return Ok(c);
    }
    let path = crate::library_path().ok_or(ControlError::NotBuilt)?;
    let control = Control::open(&path)?;
    Ok(GLOBAL.get_or_init(|| control))
}

/// [`Control::configure`] on the [`global`] library.
pub fn configure(spec: &str) -> Result<(), ControlError> {
    global()?.configure(spec)
}

/// [`Control::set_time_ms`] on the [`global`] library.
pub fn set_time_ms(ms: i64) -> Result<(), ControlError> {
    global()?.set_time_ms(ms);
    Ok(())
}
