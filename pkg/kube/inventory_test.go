package kube

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

func binding(annotations map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("rbac.authorization.k8s.io/v1")
	u.SetKind("ClusterRoleBinding")
	u.SetName("kube-proxy")
	u.SetAnnotations(annotations)

	return u
}

// TestKeepInventory: a re-applied manifest keeps the live object's membership of Talos'
// inventory, so that an unchanged manifest changes nothing (an RBAC object's unchanged
// re-apply needs no permission it grants).
func TestKeepInventory(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}
	ctx := context.Background()

	live := binding(map[string]string{InventoryAnnotation: "talos-bootstrap-manifests-inventory"})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "ClusterRoleBindingList"}, live)

	manifest := binding(nil)
	got := keepInventory(ctx, dyn.Resource(gvr), manifest)
	assert.Equal(t, "talos-bootstrap-manifests-inventory", got.GetAnnotations()[InventoryAnnotation])
	assert.Empty(t, manifest.GetAnnotations(), "the manifest itself is not changed")

	// Not in the cluster, or without the annotation: applied as it is.
	empty := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "ClusterRoleBindingList"})
	assert.Empty(t, keepInventory(ctx, empty.Resource(gvr), manifest).GetAnnotations())

	bare := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "ClusterRoleBindingList"}, binding(nil))
	assert.Empty(t, keepInventory(ctx, bare.Resource(gvr), manifest).GetAnnotations())
}
