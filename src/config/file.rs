//! Reading a configuration file so that the file cannot hurt the process: every place that
//! reads one (`check`, start, SIGHUP, the file watcher) goes through [`read`].
//!
//! Only a regular file is read, decided from its metadata before it is opened (a FIFO would
//! block the open forever, `/dev/zero` never ends), following symlinks because Kubernetes
//! mounts a ConfigMap as a chain of them. At most [`MAX_FILE_BYTES`] are read, and a longer file
//! is refused without reading the rest. The text must be UTF-8, as YAML is.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// The largest configuration file read. A tokenmeter configuration is a few KB; 256 KiB holds
/// hundreds of routes and is a quarter of what a ConfigMap may carry (1 MiB).
pub const MAX_FILE_BYTES: u64 = 256 * 1024;

/// The file's text, or why it cannot be read, as a short phrase that follows "cannot read the
/// file: " and never quotes the file's content.
pub fn read(path: &Path) -> Result<String, String> {
    let metadata = std::fs::metadata(path).map_err(|e| e.to_string())?;
    regular(&metadata)?;
    let file = File::open(path).map_err(|e| e.to_string())?;
    // The path may have been swapped since it was looked at; what was opened is what counts.
    regular(&file.metadata().map_err(|e| e.to_string())?)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "it is larger than {} KiB, the limit for a configuration file",
            MAX_FILE_BYTES / 1024
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "it is not UTF-8 text (byte {} is not)",
            e.utf8_error().valid_up_to() + 1
        )
    })
}

/// Refuses anything but a regular file, naming what it is instead.
fn regular(metadata: &Metadata) -> Result<(), String> {
    if metadata.is_file() {
        if metadata.len() > MAX_FILE_BYTES {
            return Err(format!(
                "it is larger than {} KiB ({} bytes), the limit for a configuration file",
                MAX_FILE_BYTES / 1024,
                metadata.len()
            ));
        }
        return Ok(());
    }
    let kind = if metadata.is_dir() {
        "a directory"
    } else {
        kind_of_special(metadata)
    };
    Err(format!("it is {kind}, not a regular file"))
}

#[cfg(unix)]
fn kind_of_special(metadata: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = metadata.file_type();
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn kind_of_special(_: &Metadata) -> &'static str {
    "a special file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_by_kind() {
        let e = read(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e, "it is a character device, not a regular file");
        let e = read(Path::new("/")).unwrap_err();
        assert_eq!(e, "it is a directory, not a regular file");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_and_one_at_it_read() {
        let dir = std::env::temp_dir().join(format!("tm-config-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join("at.yaml");
        std::fs::write(&at, "#".repeat(MAX_FILE_BYTES as usize)).unwrap();
        assert_eq!(read(&at).unwrap().len(), MAX_FILE_BYTES as usize);
        let over = dir.join("over.yaml");
        std::fs::write(&over, "#".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        let e = read(&over).unwrap_err();
        assert!(e.contains("larger than 256 KiB"), "{e}");
        let binary = dir.join("binary.yaml");
        std::fs::write(&binary, b"a: \xff\xfe\n").unwrap();
        assert_eq!(
            read(&binary).unwrap_err(),
            "it is not UTF-8 text (byte 4 is not)"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
