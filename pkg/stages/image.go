package stages

import (
	"errors"
	"fmt"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// ErrNoVersionTag is an image whose tag says no version: digest-only, or a tag with a
// suffix. A step cannot be judged from it, so nothing is moved from it.
var ErrNoVersionTag = errors.New("no vMAJOR.MINOR.PATCH tag (digest-only, or a suffix)")

// imageVersion parses an image's tag as a Version.
func imageVersion(image string) (Version, error) {
	tag := render.TagOf(image)
	if _, err := ParseVersion(tag); tag == "" || err != nil {
		return Version{}, fmt.Errorf("image %q: %w", image, ErrNoVersionTag)
	}

	return ParseVersion(tag)
}
