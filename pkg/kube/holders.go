package kube

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Holder is a field manager that holds fields a server-side apply would change: the
// apiserver names it in the apply's conflict. Its identity is the manager and the
// operation together: a Create or Update by "talos" (operation Update) is another
// manager than a server-side apply by "talos" (operation Apply).
type Holder struct {
	// Manager is the field manager's name ("talos", "helm", "kubectl-edit").
	Manager string
	// Operation is how it wrote the fields: metav1.ManagedFieldsOperationApply or
	// metav1.ManagedFieldsOperationUpdate.
	Operation metav1.ManagedFieldsOperationType
	// Subresource is the subresource it wrote through, "" for the object itself.
	Subresource string
}

// String is how a message names the holder: `"helm" (Update)`.
func (h Holder) String() string {
	s := fmt.Sprintf("%q (%s", h.Manager, h.Operation)
	if h.Subresource != "" {
		s += ", subresource " + h.Subresource
	}

	return s + ")"
}

// TalosOwn reports whether h is one of Talos' own writes of its bootstrap manifests,
// whose fields the sync takes over as talosctl upgrade-k8s does:
//   - field manager "talos" in either operation: Talos 1.12 and older create the objects
//     with a plain Create under it, which records operation Update
//     (internal/app/machined/pkg/controllers/k8s/manifest_apply.go at v1.12.7); Talos
//     1.13+ and talosctl upgrade-k8s 1.13+ server-side apply them under it;
//   - talosctl's update (operation Update): upgrade-k8s before 1.13 updated the objects
//     with a client-side Update that names no field manager, which the apiserver records
//     under the client's user agent, the binary's name ("talosctl", or "talosctl-<os>-<arch>"
//     as the release files are named).
func (h Holder) TalosOwn() bool {
	switch {
	case h.Manager == FieldManager:
		return true
	case h.Operation == metav1.ManagedFieldsOperationUpdate:
		return h.Manager == "talosctl" || strings.HasPrefix(h.Manager, "talosctl-")
	}

	return false
}

// TakeOver is the sync's manager rule: whether an apply that conflicts with holders takes
// their fields over (applies with conflicts forced). It does when the operator forced the
// object (--manifests-force), or when every holder is one of Talos' own writes (TalosOwn):
// the fields are Talos' either way, written under another identity. It never takes over
// another manager's change (Helm, a person's kubectl edit) unforced, nor a conflict whose
// holders it cannot tell.
func TakeOver(holders []Holder, forced bool) bool {
	if forced {
		return true
	}

	if len(holders) == 0 {
		return false
	}

	for _, h := range holders {
		if !h.TalosOwn() {
			return false
		}
	}

	return true
}

// Holders are the field managers a server-side apply conflict err names, each once, in
// the order the apiserver gives them; nil when err is no such conflict or names none it
// can read. The apiserver writes each conflict as a StatusCause of type
// FieldManagerConflict whose message is `conflict with "<manager>"`, followed by
// ` with subresource "<name>"` when there is one, and by ` using <apiVersion>[ at <time>]`
// when the manager's operation was Update
// (k8s.io/apimachinery/pkg/util/managedfields/internal/conflict.go).
func Holders(err error) []Holder {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsConflict(err) || status.Status().Details == nil {
		return nil
	}

	var out []Holder

	seen := map[Holder]bool{}

	for _, c := range status.Status().Details.Causes {
		if c.Type != metav1.CauseTypeFieldManagerConflict {
			continue
		}

		h, ok := parseHolder(c.Message)
		if !ok || seen[h] {
			continue
		}

		seen[h] = true

		out = append(out, h)
	}

	return out
}

// parseHolder reads one conflict cause's message (see Holders).
func parseHolder(msg string) (Holder, bool) {
	rest, ok := strings.CutPrefix(msg, "conflict with ")
	if !ok {
		return Holder{}, false
	}

	manager, rest, ok := cutQuoted(rest)
	if !ok {
		return Holder{}, false
	}

	h := Holder{Manager: manager, Operation: metav1.ManagedFieldsOperationApply}

	if r, found := strings.CutPrefix(rest, " with subresource "); found {
		if h.Subresource, rest, ok = cutQuoted(r); !ok {
			return Holder{}, false
		}
	}

	switch {
	case rest == "":
	case strings.HasPrefix(rest, " using "):
		h.Operation = metav1.ManagedFieldsOperationUpdate
	default:
		return Holder{}, false
	}

	return h, true
}

// cutQuoted reads the Go-quoted string s starts with, and returns it and what follows.
func cutQuoted(s string) (string, string, bool) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", "", false
	}

	v, err := strconv.Unquote(q)
	if err != nil {
		return "", "", false
	}

	return v, s[len(q):], true
}
