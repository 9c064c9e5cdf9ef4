package compat

import (
	"fmt"
	"regexp"
	"strconv"
)

// Version is a Kubernetes or Talos release version, vMAJOR.MINOR.PATCH.
type Version struct {
	// Major is the major version.
	Major uint64
	// Minor is the minor version.
	Minor uint64
	// Patch is the patch version.
	Patch uint64
}

var versionPattern = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// ParseVersion parses vX.Y.Z strictly: the leading v is required and nothing may follow
// (no -rc.0, no -beta.1, no build suffix), so every rule judges a release by what it is.
func ParseVersion(s string) (Version, error) {
	m := versionPattern.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("malformed version %q: write it as vMAJOR.MINOR.PATCH, e.g. v1.36.3", s)
	}

	var (
		v   Version
		err error
	)

	for i, dst := range []*uint64{&v.Major, &v.Minor, &v.Patch} {
		if *dst, err = strconv.ParseUint(m[i+1], 10, 64); err != nil {
			return Version{}, fmt.Errorf("malformed version %q: %w", s, err)
		}
	}

	return v, nil
}

// MustParseVersion is ParseVersion for constants in tests; it panics on a bad version.
func MustParseVersion(s string) Version {
	v, err := ParseVersion(s)
	if err != nil {
		panic(err)
	}

	return v
}

// String returns vX.Y.Z.
func (v Version) String() string {
	return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// MinorString returns X.Y.
func (v Version) MinorString() string {
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// Compare returns -1, 0 or 1 as v is older than, equal to or newer than o.
func (v Version) Compare(o Version) int {
	for _, d := range [][2]uint64{{v.Major, o.Major}, {v.Minor, o.Minor}, {v.Patch, o.Patch}} {
		switch {
		case d[0] < d[1]:
			return -1
		case d[0] > d[1]:
			return 1
		}
	}

	return 0
}

// SameMinor reports whether v and o share major and minor.
func (v Version) SameMinor(o Version) bool {
	return v.Major == o.Major && v.Minor == o.Minor
}

// Step says whether a Kubernetes component running from may move to to: never
// backwards, and at most one minor forward. A skipped minor names the minor to go to
// first.
func Step(from, to Version) error {
	switch {
	case to.Compare(from) < 0:
		return fmt.Errorf("%s is older than the running %s: downgrades are not supported", to, from)
	case to.Major != from.Major:
		return fmt.Errorf("%s changes the major version from %s: not supported", to, from)
	case to.Minor > from.Minor+1:
		return fmt.Errorf("%s skips a minor from %s: upgrade to %d.%d first", to, from, from.Major, from.Minor+1)
	}

	return nil
}
