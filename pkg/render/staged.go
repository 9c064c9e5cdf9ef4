package render

import (
	"bytes"
	"errors"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
)

// Staged says where a node's persistent machine config (the one it saved
// for its next boot) differs from its active one: a config applied in mode
// STAGED waits for the next reboot, which activates it, and an apply in
// mode NO_REBOOT would overwrite it. It returns "" when the two hash equal
// (nothing staged, or no persistent config: persistent nil), else "at
// <path>, <path>" or "the documents differ in form".
func Staged(active, persistent config.Provider) (string, error) {
	if persistent == nil || sameSource(active, persistent) {
		return "", nil
	}

	activeHash, err := Hash(active)
	if err != nil {
		return "", err
	}

	persistentHash, err := Hash(persistent)
	if err != nil {
		return "", err
	}

	if activeHash == persistentHash {
		return "", nil
	}

	var paths []string

	var changed *UnexpectedChangeError
	if err := Verify(active, persistent); errors.As(err, &changed) {
		paths = append(paths, changed.Paths...)
	}

	before, after := Images(active), Images(persistent)
	for _, c := range Components() {
		if before[c] != after[c] {
			paths = append(paths, c.PathIn(LayoutOf(active, c)))
		}
	}

	if len(paths) == 0 {
		return "the documents differ in form", nil
	}

	slices.Sort(paths)

	return "at " + strings.Join(paths, ", "), nil
}

// sameSource reports whether two configs were loaded from the same bytes. A read-only
// config (as the Talos API gives it) keeps the bytes it was loaded from, and the same
// bytes load to the same config, which hashes the same: the common case of Staged, a
// node with nothing staged, then costs no encoding.
func sameSource(a, b config.Provider) bool {
	if a == nil || b == nil || !a.Readonly() || !b.Readonly() {
		return false
	}

	ab, err := a.Bytes()
	if err != nil {
		return false
	}

	bb, err := b.Bytes()
	if err != nil {
		return false
	}

	return bytes.Equal(ab, bb)
}

// StagedAction is what to do about a staged config: settle it before ichor
// goes on with the node.
func StagedAction(ip string) string {
	return "settle it first: reboot the node into it (talosctl -n " + ip + " reboot) or apply the active config again, then resume"
}
