//! The AWS shared files, read as the AWS CLI and SDKs read them, for an
//! `s3://` image where the environment does not say: the credentials
//! file (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`,
//! section `[NAME]`) for the keys, the config file (`AWS_CONFIG_FILE`,
//! else `~/.aws/config`, section `[default]` or `[profile NAME]`) for the
//! region and the endpoint (`endpoint_url`), the profile named by the
//! mount option `profile=NAME`, else `AWS_PROFILE`, else `default`.
//!
//! mount(8) and /etc/fstab start the daemon without the user's shell, so
//! without its `AWS_*` variables: before, such a mount went to the EC2
//! instance metadata service for credentials and failed with its
//! answer. The environment still wins where it is set, variable by
//! variable, as with the AWS tools.

use crate::ObjectError;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// What a profile gives, each where the files have it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Profile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

/// The home directory: `HOME`, else the user's entry in the password
/// database (a mount started by mount(8) at boot may have no `HOME`).
fn home() -> Option<PathBuf> {
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Some(h.into()),
        None => home_from_passwd(),
    }
}

/// This user's home directory in the password database.
fn home_from_passwd() -> Option<PathBuf> {
    // SAFETY: passwd is plain data, for which all zeros (null pointers)
    // is a valid value; getpwuid_r overwrites it.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: getpwuid_r fills `pw` with pointers into `buf`, both ours and
    // alive for the call and the copy below; `found` is null on failure.
    let rc = unsafe {
        libc::getpwuid_r(
            libc::geteuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: pw_dir points to a NUL-terminated string inside `buf`.
    let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    Some(std::path::Path::new(std::ffi::OsStr::from_bytes(dir.to_bytes())).to_path_buf())
}

/// The file `var` names, else `~/.aws/NAME`.
fn file(var: &str, name: &str) -> Option<PathBuf> {
    match std::env::var_os(var).filter(|v| !v.is_empty()) {
        Some(p) => Some(p.into()),
        None => home().map(|h| h.join(".aws").join(name)),
    }
}

/// Profile `name` (the mount option, else `AWS_PROFILE`, else
/// `default`) from the shared files; a file that is not there gives
/// nothing. A profile named explicitly that neither file has is an
/// error, as is a file that does not parse.
pub(crate) fn profile(name: Option<&str>) -> Result<Profile, ObjectError> {
    let from_env = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    let named = name.map(str::to_string).or(from_env);
    let name = named.clone().unwrap_or_else(|| "default".into());
    let credentials = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    let config = file("AWS_CONFIG_FILE", "config");
    read_profile(&name, credentials, config, named.is_some())
}

fn load(path: &Option<PathBuf>) -> Result<Option<(PathBuf, ini::Ini)>, ObjectError> {
    let Some(path) = path else {
        return Ok(None);
    };
    match ini::Ini::load_from_file(path) {
        Ok(i) => Ok(Some((path.clone(), i))),
        Err(ini::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ObjectError::Invalid(format!("{}: {e}", path.display()))),
    }
}

fn read_profile(
    name: &str,
    credentials: Option<PathBuf>,
    config: Option<PathBuf>,
    required: bool,
) -> Result<Profile, ObjectError> {
    let credentials = load(&credentials)?;
    let config = load(&config)?;
    let in_credentials = credentials
        .as_ref()
        .and_then(|(_, i)| i.section(Some(name)));
    // The config file names profiles `[profile NAME]`, the default plain.
    let config_section = if name == "default" {
        "default".to_string()
    } else {
        format!("profile {name}")
    };
    let in_config = config
        .as_ref()
        .and_then(|(_, i)| i.section(Some(config_section.as_str())));
    if required && in_credentials.is_none() && in_config.is_none() {
        let seen: Vec<String> = [&credentials, &config]
            .iter()
            .filter_map(|f| f.as_ref().map(|(p, _)| p.display().to_string()))
            .collect();
        return Err(ObjectError::Invalid(format!(
            "AWS profile {name}: not in {}",
            if seen.is_empty() {
                "~/.aws/credentials or ~/.aws/config (neither is there)".into()
            } else {
                seen.join(" or ")
            }
        )));
    }
    // A key in the credentials file wins over the same in the config.
    let get = |key: &str| {
        in_credentials
            .and_then(|s| s.get(key))
            .or_else(|| in_config.and_then(|s| s.get(key)))
            .map(str::to_string)
    };
    Ok(Profile {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
        region: get("region"),
        endpoint_url: get("endpoint_url"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(test: &str, credentials: &str, config: &str) -> (PathBuf, PathBuf) {
        let d = std::env::temp_dir().join(format!("foliofs-aws-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let (c, f) = (d.join("credentials"), d.join("config"));
        std::fs::write(&c, credentials).unwrap();
        std::fs::write(&f, config).unwrap();
        (c, f)
    }

    const CREDENTIALS: &str = "\
# keys
[default]
aws_access_key_id = AKDEFAULT
aws_secret_access_key = secret-default

[backup]
aws_access_key_id=AKBACKUP
aws_secret_access_key=secret/backup+1
aws_session_token = token
";

    const CONFIG: &str = "\
[default]
region = eu-west-1

[profile backup]
region = us-east-2
endpoint_url = http://127.0.0.1:9000
";

    #[test]
    fn a_profile_takes_its_keys_and_its_config() {
        let (c, f) = files("named", CREDENTIALS, CONFIG);
        let p = read_profile("backup", Some(c.clone()), Some(f.clone()), true).unwrap();
        assert_eq!(
            p,
            Profile {
                access_key_id: Some("AKBACKUP".into()),
                secret_access_key: Some("secret/backup+1".into()),
                session_token: Some("token".into()),
                region: Some("us-east-2".into()),
                endpoint_url: Some("http://127.0.0.1:9000".into()),
            }
        );
        let d = read_profile("default", Some(c), Some(f), false).unwrap();
        assert_eq!(d.access_key_id.as_deref(), Some("AKDEFAULT"));
        assert_eq!(d.region.as_deref(), Some("eu-west-1"));
        assert_eq!(d.endpoint_url, None);
    }

    #[test]
    fn the_home_directory_is_known_without_home() {
        assert!(home_from_passwd().is_some_and(|h| h.is_absolute()));
    }

    #[test]
    fn missing_files_give_nothing_and_a_missing_named_profile_is_an_error() {
        let gone = std::env::temp_dir().join("foliofs-aws-nowhere/credentials");
        let none = read_profile("default", Some(gone.clone()), None, false).unwrap();
        assert_eq!(none, Profile::default());
        let e = read_profile("backup", Some(gone), None, true).unwrap_err();
        assert!(e.to_string().contains("AWS profile backup"), "{e}");
        let (c, f) = files("missing", CREDENTIALS, CONFIG);
        let e = read_profile("nope", Some(c), Some(f), true).unwrap_err();
        assert!(e.to_string().contains("credentials or"), "{e}");
    }
}
