package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A stopped manifest sync says what to do about its object's cause.
func TestSyncAction(t *testing.T) {
	gadgets := schema.GroupResource{Group: "example.com", Resource: "gadgets"}

	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"kind not served", &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "example.com", Kind: "Gadget"}},
			"the cluster does not serve the object's kind: install its CustomResourceDefinition"},
		{"forbidden", apierrors.NewForbidden(gadgets, "g1", errors.New("no")),
			"the Job may not write the object"},
		{"invalid", apierrors.NewBadRequest("bad"), "the apiserver refuses the object (its validation or an admission policy, as the error says)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := syncAction(fmt.Errorf("dry-run apply Gadget default/g1: %w", tc.err), "10.0.0.1")
			assert.Contains(t, got, tc.want)
			assert.Contains(t, got, "talosctl -n 10.0.0.1 get manifests")
			assert.True(t, strings.HasSuffix(got, ", then resume"), got)
		})
	}
}
