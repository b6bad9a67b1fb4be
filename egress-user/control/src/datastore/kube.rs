//! Kubernetes backend (filled in below).
