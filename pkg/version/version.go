// Package version holds the plugin's version, stamped at build time.
package version

// Version is the plugin's version. Release builds set it with
// -ldflags "-X github.com/ichor-dev/kubectl-ichor/pkg/version.Version=v0.1.0";
// it is a variable only so the linker can write it, and nothing assigns it at run time.
var Version = "dev"
