package kube

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/applyconfigurations"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
)

var (
	update = metav1.ManagedFieldsOperationUpdate
	apply  = metav1.ManagedFieldsOperationApply
)

// TestTakeOver is the sync's manager rule: Talos' own writes (manager talos in either
// operation, talosctl's update) are taken over; another manager's change only when forced.
func TestTakeOver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holders []Holder
		forced  bool
		want    bool
	}{
		{"talos' Create of Talos 1.12 (operation Update)", []Holder{{Manager: "talos", Operation: update}}, false, true},
		{"talos' server-side apply (operation Apply)", []Holder{{Manager: "talos", Operation: apply}}, false, true},
		{"talos through a subresource", []Holder{{Manager: "talos", Operation: update, Subresource: "status"}}, false, true},
		{"upgrade-k8s before 1.13 (talosctl's update)", []Holder{{Manager: "talosctl", Operation: update}}, false, true},
		{"a talosctl release binary's update", []Holder{{Manager: "talosctl-linux-amd64", Operation: update}}, false, true},
		{"an apply named talosctl is not upgrade-k8s'", []Holder{{Manager: "talosctl", Operation: apply}}, false, false},
		{"helm's update", []Holder{{Manager: "helm", Operation: update}}, false, false},
		{"helm's server-side apply", []Holder{{Manager: "helm", Operation: apply}}, false, false},
		{"a person's kubectl edit", []Holder{{Manager: "kubectl-edit", Operation: update}}, false, false},
		{"talos and helm together", []Holder{{Manager: "talos", Operation: update}, {Manager: "helm", Operation: apply}}, false, false},
		{"a conflict naming no holder it can read", nil, false, false},
		{"forced: helm's too", []Holder{{Manager: "helm", Operation: update}}, true, true},
		{"forced: anything", nil, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, TakeOver(tc.holders, tc.forced))
		})
	}
}

func TestHolders(t *testing.T) {
	conflict := func(msgs ...string) error {
		var causes []metav1.StatusCause
		for _, m := range msgs {
			causes = append(causes, metav1.StatusCause{Type: metav1.CauseTypeFieldManagerConflict, Message: m, Field: ".spec"})
		}

		return apierrors.NewApplyConflict(causes, "Apply failed")
	}

	assert.Equal(t, []Holder{
		{Manager: "talos", Operation: update},
		{Manager: "helm", Operation: apply},
		{Manager: "kubectl-edit", Operation: update},
		{Manager: "kube-controller-manager", Operation: update, Subresource: "status"},
		{Manager: `odd "name"`, Operation: apply},
	}, Holders(conflict(
		`conflict with "talos" using apps/v1`,
		`conflict with "helm"`,
		`conflict with "talos" using apps/v1`, // once
		`conflict with "kubectl-edit" using v1 at 2026-01-01T00:00:00Z`,
		`conflict with "kube-controller-manager" with subresource "status" using apps/v1`,
		`conflict with "odd \"name\""`,
		`something else`,
	)))

	assert.Nil(t, Holders(apierrors.NewApplyConflict(nil, "Apply failed with 1 conflict")))
	assert.Nil(t, Holders(apierrors.NewBadRequest("no")))
	assert.Nil(t, Holders(nil))
}

// ssaCluster is a fake cluster whose objects keep managed fields as an apiserver does
// (client-go's field-managed tracker: a Create records operation Update, an apply
// conflicts with another manager's fields and says so as the apiserver does), with
// server-side dry runs that change nothing.
type ssaCluster struct {
	dyn     *dynamicfake.FakeDynamicClient
	tracker k8stesting.ObjectTracker
	disc    *fake.Clientset
}

func newSSACluster(t *testing.T) *ssaCluster {
	t.Helper()

	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))

	tracker := k8stesting.NewFieldManagedObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder(), applyconfigurations.NewTypeConverter(scheme))
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, nil)
	dyn.ReactionChain = nil
	dyn.AddReactor("patch", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		p, _ := action.(k8stesting.PatchActionImpl)
		if len(p.PatchOptions.DryRun) == 0 {
			return false, nil, nil
		}

		// A dry run: apply, then put back what was there.
		old, getErr := tracker.Get(p.GetResource(), p.GetNamespace(), p.GetName())
		_, ret, err := k8stesting.ObjectReaction(tracker)(action)

		_ = tracker.Delete(p.GetResource(), p.GetNamespace(), p.GetName())
		if getErr == nil {
			require.NoError(t, tracker.Add(old))
		}

		return true, ret, err
	})
	dyn.AddReactor("*", "*", k8stesting.ObjectReaction(tracker))

	disc := fake.NewClientset()
	disc.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "configmaps", Namespaced: true, Kind: "ConfigMap"},
			{Name: "serviceaccounts", Namespaced: true, Kind: "ServiceAccount"},
		}},
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{{Name: "daemonsets", Namespaced: true, Kind: "DaemonSet"}}},
	}

	return &ssaCluster{dyn: dyn, tracker: tracker, disc: disc}
}

func (c *ssaCluster) applier() *ManifestApplier { return NewManifestApplier(c.dyn, c.disc.Discovery()) }

var (
	daemonSetsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}
	saGVR         = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
)

// kubeProxyDaemonSet is Talos' kube-proxy DaemonSet at image.
func kubeProxyDaemonSet(image string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": map[string]any{"name": "kube-proxy", "namespace": "kube-system"},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"k8s-app": "kube-proxy"}},
			"template": map[string]any{"metadata": map[string]any{"labels": map[string]any{"k8s-app": "kube-proxy"}},
				"spec": map[string]any{"containers": []any{map[string]any{"name": "kube-proxy", "image": image}}}},
		},
	}}
}

func configMap(name, value string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": "kube-system"}, "data": map[string]any{"x": value},
	}}
}

func serviceAccount(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": name, "namespace": "kube-system"},
	}}
}

// create creates obj as Talos 1.12 did: a plain Create under manager.
func (c *ssaCluster) create(t *testing.T, gvr schema.GroupVersionResource, obj *unstructured.Unstructured, manager string) {
	t.Helper()

	_, err := c.dyn.Resource(gvr).Namespace(obj.GetNamespace()).Create(context.Background(), obj, metav1.CreateOptions{FieldManager: manager})
	require.NoError(t, err)
}

func (c *ssaCluster) get(t *testing.T, gvr schema.GroupVersionResource, name string) *unstructured.Unstructured {
	t.Helper()

	obj, err := c.dyn.Resource(gvr).Namespace("kube-system").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)

	return obj
}

func containerImageOf(obj *unstructured.Unstructured) string {
	cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		return ""
	}

	image, _ := cs[0].(map[string]any)["image"].(string)

	return image
}

func managersOf(obj *unstructured.Unstructured) []string {
	var out []string
	for _, e := range obj.GetManagedFields() {
		out = append(out, e.Manager+"/"+string(e.Operation))
	}

	return out
}

// TestSyncTakesOverTalosOwnFields syncs the manifests of a cluster born on Talos 1.12
// (objects created by a plain Create under talos: operation Update): the kube-proxy image
// Talos' Create holds is taken over and applied; a ConfigMap Helm changed is skipped,
// naming Helm, until forced.
func TestSyncTakesOverTalosOwnFields(t *testing.T) {
	ctx := context.Background()
	c := newSSACluster(t)

	c.create(t, daemonSetsGVR, kubeProxyDaemonSet("registry.k8s.io/kube-proxy:v1.35.4"), FieldManager)
	c.create(t, configMapsGVR, configMap("coredns", "talos"), FieldManager)

	cm := c.get(t, configMapsGVR, "coredns")
	require.NoError(t, unstructured.SetNestedField(cm.Object, "helm", "data", "x"))
	_, err := c.dyn.Resource(configMapsGVR).Namespace("kube-system").Update(ctx, cm, metav1.UpdateOptions{FieldManager: "helm"})
	require.NoError(t, err)

	objs := []*unstructured.Unstructured{kubeProxyDaemonSet("registry.k8s.io/kube-proxy:v1.36.3"), configMap("coredns", "talos"), serviceAccount("kube-proxy")}

	// Without the rule, the apply meets Talos' own Create as another manager.
	data, err := objs[0].MarshalJSON()
	require.NoError(t, err)
	_, err = c.dyn.Resource(daemonSetsGVR).Namespace("kube-system").Patch(ctx, "kube-proxy", types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: FieldManager, DryRun: []string{metav1.DryRunAll}})
	require.Equal(t, []Holder{{Manager: "talos", Operation: update}}, Holders(err))

	res, err := c.applier().Sync(ctx, objs, SyncOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"DaemonSet kube-system/kube-proxy", "ServiceAccount kube-system/kube-proxy"}, res.Applied)
	assert.Equal(t, []TakenOver{{Object: "DaemonSet kube-system/kube-proxy", From: []Holder{{Manager: "talos", Operation: update}}}}, res.TakenOver)
	require.Len(t, res.Skipped, 1)
	assert.Equal(t, "ConfigMap kube-system/coredns", res.Skipped[0].Object)
	assert.Equal(t, []Holder{{Manager: "helm", Operation: update}}, res.Skipped[0].Holders)
	assert.Zero(t, res.Inventory, "Talos 1.12 keeps no inventory")

	ds := c.get(t, daemonSetsGVR, "kube-proxy")
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.36.3", containerImageOf(ds))
	assert.Contains(t, managersOf(ds), "talos/Apply")
	assert.NotContains(t, ds.GetAnnotations(), InventoryAnnotation)

	v, _, _ := unstructured.NestedString(c.get(t, configMapsGVR, "coredns").Object, "data", "x")
	assert.Equal(t, "helm", v, "Helm's change is kept")

	// Forced, Helm's field is taken too.
	res, err = c.applier().Sync(ctx, objs, SyncOptions{Force: []string{"ConfigMap kube-system/coredns"}})
	require.NoError(t, err)
	assert.Empty(t, res.Skipped)
	v, _, _ = unstructured.NestedString(c.get(t, configMapsGVR, "coredns").Object, "data", "x")
	assert.Equal(t, "talos", v)
}

// TestSyncKeepsTalosInventory syncs on a cluster whose Talos keeps the inventory (1.13+):
// the objects that exist are recorded in it, keys already there kept; an object the sync
// creates carries the inventory annotation; an existing one gets none it did not have.
func TestSyncKeepsTalosInventory(t *testing.T) {
	ctx := context.Background()
	c := newSSACluster(t)

	c.create(t, daemonSetsGVR, kubeProxyDaemonSet("registry.k8s.io/kube-proxy:v1.35.4"), FieldManager)
	c.create(t, configMapsGVR, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": InventoryName, "namespace": InventoryNamespace},
		"data": map[string]any{"kube-system_dropped__ConfigMap": ""},
	}}, "talos")

	objs := []*unstructured.Unstructured{kubeProxyDaemonSet("registry.k8s.io/kube-proxy:v1.36.3"), serviceAccount("kube-proxy")}

	dry, err := c.applier().Check(ctx, objs, SyncOptions{})
	require.NoError(t, err)
	assert.Empty(t, dry.Skipped)
	assert.Len(t, dry.TakenOver, 1)

	res, err := c.applier().Sync(ctx, objs, SyncOptions{})
	require.NoError(t, err)
	assert.Equal(t, 2, res.Inventory)

	data, _, _ := unstructured.NestedStringMap(c.get(t, configMapsGVR, InventoryName).Object, "data")
	assert.Equal(t, map[string]string{
		"kube-system_dropped__ConfigMap":         "",
		"kube-system_kube-proxy_apps_DaemonSet":  "",
		"kube-system_kube-proxy__ServiceAccount": "",
	}, data)

	assert.Equal(t, InventoryName, c.get(t, saGVR, "kube-proxy").GetAnnotations()[InventoryAnnotation], "created as Talos 1.13+ creates it")
	assert.NotContains(t, c.get(t, daemonSetsGVR, "kube-proxy").GetAnnotations(), InventoryAnnotation, "left as Talos' pass leaves an existing object")
}
