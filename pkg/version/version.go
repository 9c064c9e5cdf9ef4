// Package version holds the plugin's version and the reference of the
// container image built from the same sources, both stamped at build time.
package version

// Repository is the container image repository the Job's image is published
// to. A release tags it with the plugin's version.
const Repository = "ghcr.io/ichor-dev/kubectl-ichor"

// Version is the plugin's version. Release builds set it with
// -ldflags "-X github.com/ichor-dev/kubectl-ichor/pkg/version.Version=v0.1.0";
// it is a variable only so the linker can write it, and nothing assigns it at run time.
var Version = "dev"

// Image is the reference of the container image that holds this very binary,
// e.g. "ghcr.io/ichor-dev/kubectl-ichor:v0.1.0". hack/build.sh, hack/dist.sh
// and hack/image.sh stamp it with -ldflags "-X .../pkg/version.Image=REF"
// (the repository can be changed with $IMAGE_REPO there); it is empty in a
// binary built without the stamp. Read it through DefaultImage.
var Image = ""

// DefaultImage is the image the in-cluster Job runs unless told otherwise:
// the stamped Image, or else Repository tagged with Version. Either way it is
// the image of the plugin's own version.
func DefaultImage() string {
	if Image != "" {
		return Image
	}

	return Repository + ":" + Version
}
