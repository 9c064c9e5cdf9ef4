package manifests

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/meta/testrestmapper"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/applyconfigurations"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
)

// staticMapper is a RESTMapper of the built-in kinds that has nothing to reset.
type staticMapper struct{ meta.RESTMapper }

func (staticMapper) Reset() {}

var (
	daemonSets = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
	bindings   = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}
)

// newTestApplier is an Applier to a fake cluster whose object tracker keeps managed
// fields as an apiserver does (client-go's field-managed tracker): a Create records
// operation Update, a server-side apply operation Apply, and an apply conflicts.
func newTestApplier(t *testing.T) (*Applier, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	tracker := k8stesting.NewFieldManagedObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder(), applyconfigurations.NewTypeConverter(scheme))
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, nil)
	dyn.ReactionChain = nil
	dyn.AddReactor("*", "*", k8stesting.ObjectReaction(tracker))
	return &Applier{dyn: dyn, mapper: staticMapper{testrestmapper.TestOnlyStaticRESTMapper(scheme)}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}, dyn
}

func u(obj map[string]any) *unstructured.Unstructured { return &unstructured.Unstructured{Object: obj} }

// bootstrapObjects are a kube-proxy DaemonSet at image and its ClusterRoleBinding.
func bootstrapObjects(image string) []*unstructured.Unstructured {
	return []*unstructured.Unstructured{
		u(map[string]any{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"name": "kube-proxy", "namespace": "kube-system"},
			"spec": map[string]any{
				"selector": map[string]any{"matchLabels": map[string]any{"k8s-app": "kube-proxy"}},
				"template": map[string]any{"metadata": map[string]any{"labels": map[string]any{"k8s-app": "kube-proxy"}},
					"spec": map[string]any{"containers": []any{map[string]any{"name": "kube-proxy", "image": image}}}},
			}}),
		u(map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": map[string]any{"name": "system:kube-proxy"},
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
			"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}}}),
	}
}

func get(t *testing.T, dyn *dynamicfake.FakeDynamicClient, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	var ri = dyn.Resource(gvr).Namespace(ns)
	obj, err := ri.Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return obj
}

func managers(obj *unstructured.Unstructured) []string {
	var out []string
	for _, e := range obj.GetManagedFields() {
		out = append(out, e.Manager+"/"+string(e.Operation))
	}
	return out
}

func image(t *testing.T, obj *unstructured.Unstructured) string {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	require.Len(t, cs, 1)
	return cs[0].(map[string]any)["image"].(string)
}

func inventoryKeys(t *testing.T, dyn *dynamicfake.FakeDynamicClient) []string {
	t.Helper()
	inv, err := ReadInventory(context.Background(), dyn)
	require.NoError(t, err)
	return inv.Keys()
}

// TestBornOnTalos112 creates the bootstrap objects as Talos 1.12 does: a plain Create
// under "talos" (operation Update), no inventory, no annotation; an existing object is
// never changed.
func TestBornOnTalos112(t *testing.T) {
	a, dyn := newTestApplier(t)
	ctx := context.Background()

	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.12.4", bootstrapObjects("registry.k8s.io/kube-proxy:v1.35.4")))

	ds := get(t, dyn, daemonSets, "kube-system", "kube-proxy")
	assert.Equal(t, []string{"talos/Update"}, managers(ds))
	assert.NotContains(t, ds.GetAnnotations(), InventoryAnnotation)
	assert.Equal(t, []string{"talos/Update"}, managers(get(t, dyn, bindings, "", "system:kube-proxy")))

	_, err := dyn.Resource(configMaps).Namespace(InventoryNamespace).Get(ctx, InventoryName, metav1.GetOptions{})
	assert.Error(t, err, "Talos 1.12 keeps no inventory")

	// A new render does not change what exists.
	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.12.4", bootstrapObjects("registry.k8s.io/kube-proxy:v1.36.3")))
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.35.4", image(t, get(t, dyn, daemonSets, "kube-system", "kube-proxy")))
}

// TestBornOnTalos113 creates them as Talos 1.13 and later do: server-side apply under
// "talos" with the inventory annotation, each in the inventory ConfigMap; one deleted
// since is not created again.
func TestBornOnTalos113(t *testing.T) {
	a, dyn := newTestApplier(t)
	ctx := context.Background()

	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.13.9", bootstrapObjects("registry.k8s.io/kube-proxy:v1.35.4")))

	ds := get(t, dyn, daemonSets, "kube-system", "kube-proxy")
	assert.Equal(t, []string{"talos/Apply"}, managers(ds))
	assert.Equal(t, InventoryName, ds.GetAnnotations()[InventoryAnnotation])
	assert.Equal(t, []string{"_system__kube-proxy_rbac.authorization.k8s.io_ClusterRoleBinding", "kube-system_kube-proxy_apps_DaemonSet"},
		inventoryKeys(t, dyn))

	require.NoError(t, dyn.Resource(bindings).Delete(ctx, "system:kube-proxy", metav1.DeleteOptions{}))
	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.14.1", bootstrapObjects("registry.k8s.io/kube-proxy:v1.35.4")))
	_, err := dyn.Resource(bindings).Get(ctx, "system:kube-proxy", metav1.GetOptions{})
	assert.Error(t, err, "in the inventory: never created again")
}

// TestBornOn112UpgradedTo113 keeps a cluster's objects through the Talos upgrade: the
// 1.13 pass adds them to the inventory and changes nothing of them (their fields stay
// talos/Update's, without the annotation).
func TestBornOn112UpgradedTo113(t *testing.T) {
	a, dyn := newTestApplier(t)
	ctx := context.Background()

	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.12.4", bootstrapObjects("registry.k8s.io/kube-proxy:v1.35.4")))
	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.13.9", bootstrapObjects("registry.k8s.io/kube-proxy:v1.35.4")))

	ds := get(t, dyn, daemonSets, "kube-system", "kube-proxy")
	assert.Equal(t, []string{"talos/Update"}, managers(ds))
	assert.NotContains(t, ds.GetAnnotations(), InventoryAnnotation)
	assert.Len(t, inventoryKeys(t, dyn), 2, "backfilled")

	// Talos' own server-side apply of the next render meets its own Create as another manager.
	data, err := bootstrapObjects("registry.k8s.io/kube-proxy:v1.36.3")[0].MarshalJSON()
	require.NoError(t, err)
	_, err = dyn.Resource(daemonSets).Namespace("kube-system").Patch(ctx, "kube-proxy", types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager})
	require.ErrorContains(t, err, `conflict with "talos" using apps/v1`)
}

// TestSyncAsUpgradeK8s syncs as talosctl upgrade-k8s does: every field taken over
// (another manager's too), every object marked and in the inventory, and an object the
// manifests dropped pruned.
func TestSyncAsUpgradeK8s(t *testing.T) {
	a, dyn := newTestApplier(t)
	ctx := context.Background()

	extra := u(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "dropped", "namespace": "kube-system"}})
	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.12.4", append(bootstrapObjects("registry.k8s.io/kube-proxy:v1.35.4"), extra)))
	require.NoError(t, a.applyObjects(ctx, "cp-1", "v1.13.9", append(bootstrapObjects("registry.k8s.io/kube-proxy:v1.35.4"), extra)))

	res, err := a.SyncAsUpgradeK8s(ctx, bootstrapObjects("registry.k8s.io/kube-proxy:v1.36.3"))
	require.NoError(t, err)
	assert.Equal(t, []string{"DaemonSet kube-system/kube-proxy", "ClusterRoleBinding system:kube-proxy"}, res.Applied)
	assert.Equal(t, []string{"ConfigMap kube-system/dropped"}, res.Pruned)

	ds := get(t, dyn, daemonSets, "kube-system", "kube-proxy")
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.36.3", image(t, ds))
	assert.Contains(t, managers(ds), "talos/Apply")
	assert.Equal(t, InventoryName, ds.GetAnnotations()[InventoryAnnotation])
	assert.Len(t, inventoryKeys(t, dyn), 2)

	_, err = dyn.Resource(configMaps).Namespace("kube-system").Get(ctx, "dropped", metav1.GetOptions{})
	assert.Error(t, err, "pruned")
}

func TestInventoryKey(t *testing.T) {
	for _, obj := range []*unstructured.Unstructured{bootstrapObjects("x")[0], bootstrapObjects("x")[1]} {
		ns, name, group, kind, ok := parseInventoryKey(InventoryKey(obj))
		require.True(t, ok)
		assert.Equal(t, []string{obj.GetNamespace(), obj.GetName(), obj.GroupVersionKind().Group, obj.GetKind()}, []string{ns, name, group, kind})
	}
	assert.Equal(t, "kube-system_coredns__ConfigMap",
		InventoryKey(u(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "coredns", "namespace": "kube-system"}})))
	assert.False(t, TracksInventory("v1.12.11"))
	assert.True(t, TracksInventory("v1.13.0"))
	assert.True(t, TracksInventory("v1.14.1"))
}
