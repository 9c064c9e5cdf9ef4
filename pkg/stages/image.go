package stages

import (
	"fmt"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// imageVersion parses an image's tag as a Version.
func imageVersion(image string) (Version, error) {
	tag := render.TagOf(image)
	if tag == "" {
		return Version{}, fmt.Errorf("image %q has no version tag", image)
	}

	v, err := ParseVersion(tag)
	if err != nil {
		return Version{}, fmt.Errorf("image %q: %w", image, err)
	}

	return v, nil
}
