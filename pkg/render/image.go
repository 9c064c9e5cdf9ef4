package render

import (
	"fmt"
	"strings"
)

// validTag reports whether tag follows the OCI distribution grammar for a
// tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}.
func validTag(tag string) bool {
	if tag == "" || len(tag) > 128 || tag[0] == '.' || tag[0] == '-' {
		return false
	}

	for _, r := range tag {
		if !isAlnum(r) && r != '_' && r != '.' && r != '-' {
			return false
		}
	}

	return true
}

// validDigest reports whether digest looks like algorithm:encoded, the
// encoded part at least 32 characters (sha256 has 64 hex digits).
func validDigest(digest string) bool {
	algorithm, encoded, ok := strings.Cut(digest, ":")
	if !ok || algorithm == "" || len(encoded) < 32 {
		return false
	}

	for _, r := range algorithm {
		if !isAlnum(r) && r != '+' && r != '.' && r != '_' && r != '-' {
			return false
		}
	}

	for _, r := range encoded {
		if !isAlnum(r) && r != '=' && r != '_' && r != '-' {
			return false
		}
	}

	return true
}

// validRepository reports whether name is [host[:port]/]path: path
// components of lowercase letters, digits and separators; only the first of
// several components may be a host, with a port.
func validRepository(name string) bool {
	components := strings.Split(name, "/")

	for i, c := range components {
		if c == "" {
			return false
		}

		host := i == 0 && len(components) > 1

		for _, r := range c {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			case host && (r >= 'A' && r <= 'Z' || r == ':' || r == '[' || r == ']'):
			default:
				return false
			}
		}
	}

	return true
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// imageRef is an image reference split into its parts:
// repository[:tag][@digest].
type imageRef struct {
	repository string
	tag        string
	digest     string
}

// parseImage splits an image reference. It keeps the repository exactly as
// written (registry host, port and path included), so a private mirror path
// survives a tag change.
func parseImage(image string) (imageRef, error) {
	if strings.TrimSpace(image) != image || image == "" {
		return imageRef{}, fmt.Errorf("image %q: not an image reference", image)
	}

	var ref imageRef

	name := image
	if at := strings.IndexByte(image, '@'); at >= 0 {
		name, ref.digest = image[:at], image[at+1:]
		if !validDigest(ref.digest) {
			return imageRef{}, fmt.Errorf("image %q: digest %q is not algorithm:hex", image, ref.digest)
		}
	}

	// A colon after the last slash separates the tag; one before it is a
	// registry port (registry.example.com:5000/kube-apiserver).
	if colon := strings.LastIndexByte(name, ':'); colon > strings.LastIndexByte(name, '/') {
		name, ref.tag = name[:colon], name[colon+1:]
		if !validTag(ref.tag) {
			return imageRef{}, fmt.Errorf("image %q: tag %q is not a valid tag", image, ref.tag)
		}
	}

	if !validRepository(name) {
		return imageRef{}, fmt.Errorf("image %q: no repository (want [host[:port]/]path[:tag][@digest])", image)
	}

	ref.repository = name

	return ref, nil
}

// TagOf returns the tag of an image reference ("v1.36.3" for
// "registry.k8s.io/kube-apiserver:v1.36.3@sha256:..."), or "" when the
// reference has no tag or cannot be parsed.
func TagOf(image string) string {
	ref, err := parseImage(image)
	if err != nil {
		return ""
	}

	return ref.tag
}

// RepositoryOf returns the repository of an image reference, without tag or
// digest ("registry.example.com:5000/mirror/kube-apiserver"), or "" when the
// reference cannot be parsed.
func RepositoryOf(image string) string {
	ref, err := parseImage(image)
	if err != nil {
		return ""
	}

	return ref.repository
}

// DigestOf returns the digest an image reference is pinned to
// ("sha256:..."), or "" when it has none or cannot be parsed.
func DigestOf(image string) string {
	ref, err := parseImage(image)
	if err != nil {
		return ""
	}

	return ref.digest
}

// WithTag returns image with its tag replaced by tag, keeping its repository
// as written. A digest is dropped: a runtime pulls a reference with a digest
// by the digest alone, so keeping the old digest would keep the old image
// under a new tag. Callers that must tell the user use DigestOf first.
func WithTag(image, tag string) (string, error) {
	ref, err := parseImage(image)
	if err != nil {
		return "", err
	}

	if !validTag(tag) {
		return "", fmt.Errorf("tag %q is not a valid image tag", tag)
	}

	return ref.repository + ":" + tag, nil
}
