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

// TestMarkInventory: a re-applied manifest keeps the live object's membership of Talos'
// inventory, so that an unchanged manifest changes nothing (an RBAC object's unchanged
// re-apply needs no permission it grants); an existing object without the mark stays
// without it, as Talos' own pass leaves it; one the sync creates on a cluster whose Talos
// keeps the inventory is marked, as Talos 1.13+ creates it.
func TestMarkInventory(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}
	ctx := context.Background()
	client := func(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
		return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "ClusterRoleBindingList"}, objs...)
	}

	live := binding(map[string]string{InventoryAnnotation: InventoryName})
	manifest := binding(nil)

	for _, inventory := range []bool{false, true} {
		got := markInventory(ctx, client(live).Resource(gvr), manifest, inventory)
		assert.Equal(t, InventoryName, got.GetAnnotations()[InventoryAnnotation])
		assert.Empty(t, manifest.GetAnnotations(), "the manifest itself is not changed")

		// There without the mark: applied as it is, with an inventory or without.
		assert.Empty(t, markInventory(ctx, client(binding(nil)).Resource(gvr), manifest, inventory).GetAnnotations())
	}

	// Not in the cluster: marked where Talos keeps the inventory.
	assert.Empty(t, markInventory(ctx, client().Resource(gvr), manifest, false).GetAnnotations())
	assert.Equal(t, InventoryName, markInventory(ctx, client().Resource(gvr), manifest, true).GetAnnotations()[InventoryAnnotation])
}

func TestInventoryKey(t *testing.T) {
	cm := &unstructured.Unstructured{}
	cm.SetAPIVersion("v1")
	cm.SetKind("ConfigMap")
	cm.SetName("coredns")

	assert.Equal(t, "kube-system_coredns__ConfigMap", inventoryKey(cm, "kube-system"))

	crb := binding(nil)
	crb.SetName("system:coredns")
	assert.Equal(t, "_system__coredns_rbac.authorization.k8s.io_ClusterRoleBinding", inventoryKey(crb, ""))
}
