package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is a fake cluster for the engine's tests: a client-go fake
// clientset holding Nodes, mirror pods, the kube-proxy DaemonSet and its
// pods, and workloads; a fake dynamic client that takes the bootstrap
// manifests; and a fake Talos whose machines hold configs generated with
// machinery's generate package. An apply moves what the machine runs at
// once (mirror pods, the Node's kubelet version), and every move is recorded
// as an event, as the simulator's events.jsonl does, so a test can check
// the invariant at every step independently of the engine.

var (
	podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	podGVK  = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
)

// event is one start of a component at a version on a node.
type event struct {
	node, component, version string
}

// applyCall is one Apply the engine made.
type applyCall struct {
	node   string // node name
	dryRun bool
	failed bool // the apply did not take
	images map[render.Component]string
	hash   string
}

// faults are what a fake machine does wrong.
type faults struct {
	neverReady   []discovery.Component // static pods that never get Ready after a restart
	stayNotReady bool                  // the Node stays NotReady after its kubelet restarts
	pullFails    bool
	pullUnsup    bool
	applyBlocks  bool          // a non-dry-run apply blocks until its context ends
	pullDelay    time.Duration // each image pull takes this long, unless its context ends first
}

// fakeMachine is one node's Talos side.
type fakeMachine struct {
	name         string
	ip           string
	controlPlane bool
	talos        string
	active       config.Provider
	persistent   config.Provider
	faults       faults
}

// fakeCluster is the whole fake.
type fakeCluster struct {
	t        *testing.T
	cs       *fake.Clientset
	dyn      *dynamicfake.FakeDynamicClient
	machines []*fakeMachine

	mu      sync.Mutex
	events  []event
	applies []applyCall
	pulls   []string // "node ns ref"
	// onPull, when set, is called at every PullImage before it acts (node
	// name, reference).
	onPull    func(node, ref string)
	evictions []string // "node ns/name"
	applied   []string // manifests: "fieldManager force Kind ns/name"
	dryRuns   int      // manifests dry-run
	// manifestOwners are objects ("Kind ns/name") with fields another field manager
	// owns that an apply would take over: a non-forced apply conflicts, naming the
	// manager ("helm", or "talos/Update" for a manager whose operation was Update) as
	// the apiserver does. The kube-proxy DaemonSet conflicts only when the apply
	// changes its image, as a server-side apply conflicts only on a changed value.
	manifestOwners map[string]string
	// appliedObjects are the objects of the non-dry-run manifest applies, as sent.
	appliedObjects []*unstructured.Unstructured
	// manifestForbidden are objects ("Kind ns/name") the runner may not write.
	manifestForbidden map[string]bool
	// staleManifests is how many reads of the manifests still show kube-proxy at
	// staleImage (Talos re-renders them asynchronously); -1 for every read.
	staleManifests int
	staleImage     string
	cordonMax      int            // most nodes cordoned by ichor at once, seen at apply time
	pulling        map[string]int // images being pulled, by node
	pullingMax     int            // most nodes pulling at once

	// rolloutStuck keeps the kube-proxy DaemonSet from ever becoming
	// available after a sync.
	rolloutStuck bool
	// pdbBlocks refuses every eviction with 429, as a budget at 0 does.
	pdbBlocks bool
	// onEvict, when set, is called on each eviction (after the pod is gone).
	onEvict func(ns, name string)
	// beforeApply, when set, is called before every non-dry-run apply.
	beforeApply func(ctx context.Context, m *fakeMachine)
	// kubeletMoved, when set, is called once an apply moved a node's kubelet.
	kubeletMoved func(m *fakeMachine, version string)
}

// clusterSpec describes a fake cluster.
type clusterSpec struct {
	controlPlanes, workers int
	kubernetes             string // every component's version, e.g. "v1.35.4"
	talos                  string
	proxyDisabled          bool
	workloads              int // pods per worker, owned by a ReplicaSet
}

func newFakeCluster(t *testing.T, spec clusterSpec) *fakeCluster {
	t.Helper()

	if spec.talos == "" {
		spec.talos = "v1.13.9"
	}

	bundle, err := testSecrets()
	require.NoError(t, err)

	// The layout of talosctl gen config of that Talos: v1alpha1 up to 1.13,
	// the component documents from 1.14.
	contract, err := config.ParseContractFromVersion(spec.talos)
	require.NoError(t, err)

	in, err := generate.NewInput("prod", "https://10.0.0.10:6443", strings.TrimPrefix(spec.kubernetes, "v"),
		generate.WithSecretsBundle(bundle), generate.WithVersionContract(contract),
		generate.WithInstallImage("ghcr.io/siderolabs/installer:"+spec.talos))
	require.NoError(t, err)

	f := &fakeCluster{t: t}

	add := func(name, ip string, cp bool) {
		typ := machine.TypeWorker
		if cp {
			typ = machine.TypeControlPlane
		}

		cfg, err := in.Config(typ)
		require.NoError(t, err)

		if spec.proxyDisabled && cp && cfg.Has(k8s.KubeProxyConfig) {
			out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), []configpatcher.Patch{mustPatch(t,
				"apiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\n")})
			require.NoError(t, err)

			cfg, err = out.Config()
			require.NoError(t, err)
		} else if spec.proxyDisabled && cp {
			cfg, err = cfg.PatchV1Alpha1(func(c *v1alpha1.Config) error {
				c.ClusterConfig.ProxyConfig = &v1alpha1.ProxyConfig{Disabled: new(true)}

				return nil
			})
			require.NoError(t, err)
		}

		loaded := reloadConfig(t, cfg)
		f.machines = append(f.machines, &fakeMachine{
			name: name, ip: ip, controlPlane: cp, talos: spec.talos, active: loaded, persistent: loaded,
		})
	}

	for i := 1; i <= spec.controlPlanes; i++ {
		add(fmt.Sprintf("cp-%d", i), fmt.Sprintf("10.0.0.1%d", i), true)
	}

	for i := 1; i <= spec.workers; i++ {
		add(fmt.Sprintf("worker-%d", i), fmt.Sprintf("10.0.0.2%d", i), false)
	}

	var objs []runtime.Object

	for _, m := range f.machines {
		objs = append(objs, f.nodeObject(m, spec.kubernetes))

		if m.controlPlane {
			for _, c := range discovery.StaticPodComponents() {
				objs = append(objs, mirrorPod(m.name, c, spec.kubernetes))
			}
		}

		if !spec.proxyDisabled {
			objs = append(objs, kubeProxyPod(m.name, spec.kubernetes))
		}

		if !m.controlPlane {
			for i := range spec.workloads {
				objs = append(objs, workloadPod(m.name, i))
			}
		}
	}

	if !spec.proxyDisabled {
		objs = append(objs, kubeProxyDaemonSet(spec.kubernetes, int32(len(f.machines))))
	}

	// The simple clientset: the field-managed one (NewClientset) costs a
	// third of these tests' time in managed-fields bookkeeping they never
	// look at (the bootstrap manifests go through the dynamic fake).
	f.cs = fake.NewSimpleClientset(objs...) //nolint:staticcheck // see above
	f.cs.Resources = apiResources()
	f.cs.PrependReactor("list", "pods", f.listPodsByNode)
	f.cs.PrependReactor("create", "pods", f.evict)

	f.dyn = dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	f.dyn.PrependReactor("patch", "*", f.applyManifest)

	for _, m := range f.machines {
		f.record(m.name, string(discovery.Kubelet), spec.kubernetes)

		if m.controlPlane {
			for _, c := range discovery.StaticPodComponents() {
				f.record(m.name, string(c), spec.kubernetes)
			}
		}

		if !spec.proxyDisabled {
			f.record(m.name, string(discovery.KubeProxy), spec.kubernetes)
		}
	}

	return f
}

// testSecrets makes the cluster secrets once per test binary: generating
// them (RSA keys) takes over a second, and every fake cluster can share them.
var testSecrets = sync.OnceValues(func() (*secrets.Bundle, error) {
	return secrets.NewBundle(secrets.NewClock(), config.TalosVersionCurrent)
})

// reloadConfig encodes cfg and loads it back, as a node holds it.
// mustPatch loads a strategic merge patch.
func mustPatch(t *testing.T, patch string) configpatcher.Patch {
	t.Helper()

	p, err := configpatcher.LoadPatch([]byte(patch))
	require.NoError(t, err)

	return p
}

func reloadConfig(t *testing.T, cfg config.Provider) config.Provider {
	t.Helper()

	b, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	require.NoError(t, err)

	loaded, err := configloader.NewFromBytes(b)
	require.NoError(t, err)

	return loaded
}

func apiResources() []*metav1.APIResourceList {
	return []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "pods", Namespaced: true, Kind: "Pod"},
			{Name: "pods/eviction", Namespaced: true, Kind: "Eviction", Group: "policy", Version: "v1"},
			{Name: "serviceaccounts", Namespaced: true, Kind: "ServiceAccount"},
			{Name: "configmaps", Namespaced: true, Kind: "ConfigMap"},
			{Name: "nodes", Kind: "Node"},
		}},
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{
			{Name: "daemonsets", Namespaced: true, Kind: "DaemonSet"},
		}},
		{GroupVersion: "rbac.authorization.k8s.io/v1", APIResources: []metav1.APIResource{
			{Name: "clusterrolebindings", Kind: "ClusterRoleBinding"},
		}},
	}
}

func (f *fakeCluster) nodeObject(m *fakeMachine, kubelet string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: m.name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: m.ip}},
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: kubelet, OSImage: fmt.Sprintf("Talos (%s)", m.talos)},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}

	if m.controlPlane {
		n.Labels[discovery.ControlPlaneLabel] = ""
	}

	return n
}

func mirrorPod(node string, c discovery.Component, version string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: fmt.Sprintf("%s-%s", c, node),
			Labels:      map[string]string{discovery.ComponentLabel: string(c), "tier": "control-plane"},
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x", discovery.ConfigVersionAnnotation: "1"},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: string(c), Image: "registry.k8s.io/" + string(c) + ":" + version}}},
		Status: readyStatus(true),
	}
}

func kubeProxyPod(node, version string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: "kube-proxy-" + node,
			Labels: map[string]string{discovery.ComponentLabel: "kube-proxy"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: "kube-proxy", Controller: new(true),
			}},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:" + version}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: readyStatus(true).Conditions},
	}
}

func workloadPod(node string, i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: fmt.Sprintf("web-%s-%d", node, i), Labels: map[string]string{"app": "web"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", Controller: new(true)}},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "web", Image: "nginx"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func kubeProxyDaemonSet(version string, n int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy", Generation: 1},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:" + version}},
		}}},
		Status: appsv1.DaemonSetStatus{
			ObservedGeneration: 1, DesiredNumberScheduled: n, UpdatedNumberScheduled: n, NumberAvailable: n, NumberReady: n,
		},
	}
}

func readyStatus(ready bool) corev1.PodStatus {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}

	return corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}}
}

func (f *fakeCluster) machine(name string) *fakeMachine {
	for _, m := range f.machines {
		if m.name == name || m.ip == name {
			return m
		}
	}

	f.t.Fatalf("no machine %s", name)

	return nil
}

func (f *fakeCluster) record(node, component, version string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.events = append(f.events, event{node: node, component: component, version: version})
}

// engine returns an Engine over the fake with short bounds.
func (f *fakeCluster) engine(target string, mutate ...func(*Options)) *Engine {
	opts := Options{
		Kind: KindKubernetes, Target: target, MaxUnavailable: 1,
		ApplyTimeout: 5e9, VerifyTimeout: 5e9, DrainTimeout: 5e9, PullTimeout: 5e9, StaticPodSettle: 1e8,
	}

	for _, fn := range mutate {
		fn(&opts)
	}

	return &Engine{Kube: f.cs, Dynamic: f.dyn, Talos: (*fakeTalos)(f), Options: opts, evictRetryDelay: 1e6}
}

// listPodsByNode serves the drain's LIST of a node's pods, which selects by
// field (the fake clientset ignores field selectors).
func (f *fakeCluster) listPodsByNode(action k8stesting.Action) (bool, runtime.Object, error) {
	list, ok := action.(k8stesting.ListActionImpl)
	if !ok || list.ListRestrictions.Fields == nil || list.ListRestrictions.Fields.Empty() {
		return false, nil, nil
	}

	obj, err := f.cs.Tracker().List(podsGVR, podGVK, list.GetNamespace())
	if err != nil {
		return true, nil, err
	}

	all, _ := obj.(*corev1.PodList)
	out := &corev1.PodList{}

	for _, p := range all.Items {
		if list.ListRestrictions.Fields.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) &&
			list.ListRestrictions.Labels.Matches(labels.Set(p.Labels)) {
			out.Items = append(out.Items, p)
		}
	}

	return true, out, nil
}

// evict serves pods/eviction: the pod goes at once, or a budget refuses.
func (f *fakeCluster) evict(action k8stesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(k8stesting.CreateActionImpl)
	if !ok || create.GetSubresource() != "eviction" {
		return false, nil, nil
	}

	ev, _ := create.GetObject().(*policyv1.Eviction)

	if f.pdbBlocks {
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	}

	obj, err := f.cs.Tracker().Get(podsGVR, ev.Namespace, ev.Name)
	if err != nil {
		return true, nil, err
	}

	pod, _ := obj.(*corev1.Pod)

	if err := f.cs.Tracker().Delete(podsGVR, ev.Namespace, ev.Name); err != nil {
		return true, nil, err
	}

	f.mu.Lock()
	f.evictions = append(f.evictions, pod.Spec.NodeName+" "+ev.Namespace+"/"+ev.Name)
	onEvict := f.onEvict
	f.mu.Unlock()

	if onEvict != nil {
		onEvict(ev.Namespace, ev.Name)
	}

	return true, nil, nil
}

// applyManifest serves the server-side apply of the bootstrap manifests: the
// kube-proxy DaemonSet takes the new image and rolls out.
func (f *fakeCluster) applyManifest(action k8stesting.Action) (bool, runtime.Object, error) {
	patch, _ := action.(k8stesting.PatchActionImpl)

	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(patch.GetPatch()); err != nil {
		return true, nil, err
	}

	force := patch.PatchOptions.Force != nil && *patch.PatchOptions.Force
	key := fmt.Sprintf("%s %s/%s", obj.GetKind(), patch.GetNamespace(), obj.GetName())
	gr := schema.GroupResource{Group: patch.GetResource().Group, Resource: patch.GetResource().Resource}

	f.mu.Lock()
	owner, owned := f.manifestOwners[key]
	forbidden := f.manifestForbidden[key]
	f.mu.Unlock()

	if owned && obj.GetKind() == "DaemonSet" && obj.GetName() == "kube-proxy" {
		ds, err := f.cs.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
		require.NoError(f.t, err)

		owned = ds.Spec.Template.Spec.Containers[0].Image != kubeProxyImage([]*unstructured.Unstructured{obj})
	}

	switch {
	case forbidden:
		return true, nil, apierrors.NewForbidden(gr, obj.GetName(), errors.New("the runner may not patch it"))
	case owned && !force:
		manager, op, _ := strings.Cut(owner, "/")
		msg := fmt.Sprintf("conflict with %q", manager)

		if op == "Update" {
			msg += " using " + obj.GetAPIVersion()
		}

		return true, nil, apierrors.NewApplyConflict([]metav1.StatusCause{{
			Type: metav1.CauseTypeFieldManagerConflict, Message: msg, Field: ".spec.template",
		}}, fmt.Sprintf("Apply failed with 1 conflict: %s: .spec.template", msg))
	}

	if len(patch.PatchOptions.DryRun) > 0 {
		f.mu.Lock()
		f.dryRuns++
		f.mu.Unlock()

		return true, obj, nil
	}

	f.mu.Lock()
	f.applied = append(f.applied, fmt.Sprintf("%s %t %s %s/%s", patch.PatchOptions.FieldManager, force, obj.GetKind(), patch.GetNamespace(), obj.GetName()))
	f.appliedObjects = append(f.appliedObjects, obj.DeepCopy())
	f.mu.Unlock()

	if obj.GetKind() == "DaemonSet" && obj.GetName() == "kube-proxy" {
		var ds appsv1.DaemonSet
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &ds); err != nil {
			return true, nil, err
		}

		f.rollKubeProxy(ds.Spec.Template.Spec.Containers[0].Image)
	}

	return true, obj, nil
}

// rollKubeProxy sets the DaemonSet's image and, unless stuck, rolls its pods.
func (f *fakeCluster) rollKubeProxy(image string) {
	ctx := context.Background()

	ds, err := f.cs.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(f.t, err)

	if ds.Spec.Template.Spec.Containers[0].Image == image {
		return
	}

	ds.Spec.Template.Spec.Containers[0].Image = image
	ds.Generation++
	ds.Status.ObservedGeneration = ds.Generation
	ds.Status.UpdatedNumberScheduled, ds.Status.NumberAvailable = 0, 0

	if !f.rolloutStuck {
		ds.Status.UpdatedNumberScheduled, ds.Status.NumberAvailable = ds.Status.DesiredNumberScheduled, ds.Status.DesiredNumberScheduled

		for _, m := range f.machines {
			pod, err := f.cs.CoreV1().Pods("kube-system").Get(ctx, "kube-proxy-"+m.name, metav1.GetOptions{})
			require.NoError(f.t, err)

			pod.Spec.Containers[0].Image = image
			_, err = f.cs.CoreV1().Pods("kube-system").Update(ctx, pod, metav1.UpdateOptions{})
			require.NoError(f.t, err)
			f.record(m.name, string(discovery.KubeProxy), render.TagOf(image))
		}
	}

	_, err = f.cs.AppsV1().DaemonSets("kube-system").Update(ctx, ds, metav1.UpdateOptions{})
	require.NoError(f.t, err)
}

// takeConfig makes cfg the machine's active config and moves what it runs:
// each static pod whose image changed restarts on it (Ready unless faulted),
// and the kubelet restarts on a new image (Ready unless faulted).
func (f *fakeCluster) takeConfig(m *fakeMachine, cfg config.Provider) {
	ctx := context.Background()
	before := render.Images(m.active)
	after := render.Images(cfg)

	f.mu.Lock()
	m.active, m.persistent = cfg, cfg
	f.mu.Unlock()

	for _, c := range discovery.StaticPodComponents() {
		if before[c] == after[c] || after[c] == "" {
			continue
		}

		name := fmt.Sprintf("%s-%s", c, m.name)
		pod, err := f.cs.CoreV1().Pods("kube-system").Get(ctx, name, metav1.GetOptions{})
		require.NoError(f.t, err)

		pod.Spec.Containers[0].Image = after[c]
		pod.Status = readyStatus(!slices.Contains(m.faults.neverReady, c))
		_, err = f.cs.CoreV1().Pods("kube-system").Update(ctx, pod, metav1.UpdateOptions{})
		require.NoError(f.t, err)
		f.record(m.name, string(c), render.TagOf(after[c]))
	}

	if before[discovery.Kubelet] != after[discovery.Kubelet] {
		node, err := f.cs.CoreV1().Nodes().Get(ctx, m.name, metav1.GetOptions{})
		require.NoError(f.t, err)

		node.Status.NodeInfo.KubeletVersion = render.TagOf(after[discovery.Kubelet])
		if m.faults.stayNotReady {
			node.Status.Conditions = []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "container runtime network not ready",
			}}
		}

		_, err = f.cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		require.NoError(f.t, err)
		f.record(m.name, string(discovery.Kubelet), node.Status.NodeInfo.KubeletVersion)

		if f.kubeletMoved != nil {
			f.kubeletMoved(m, node.Status.NodeInfo.KubeletVersion)
		}
	}
}

// cordonedByIchor counts the nodes that carry the cordon mark.
func (f *fakeCluster) cordonedByIchor() []string {
	nodes, err := f.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	require.NoError(f.t, err)

	var out []string

	for _, n := range nodes.Items {
		if kube.CordonedByIchor(&n) {
			out = append(out, n.Name)
		}
	}

	return out
}

// realApplies returns the applies that took, in order.
func (f *fakeCluster) realApplies() []applyCall {
	f.mu.Lock()
	defer f.mu.Unlock()

	var out []applyCall

	for _, a := range f.applies {
		if !a.dryRun && !a.failed {
			out = append(out, a)
		}
	}

	return out
}

// invariantHistory replays the events and returns every point at which a
// controller-manager, scheduler, kube-proxy or kubelet was newer than some
// apiserver.
func (f *fakeCluster) invariantHistory() []string {
	f.mu.Lock()
	defer f.mu.Unlock()

	state := map[string]kube.Running{}

	var broken []string

	for i, e := range f.events {
		state[e.node+"/"+e.component] = kube.Running{Node: e.node, Component: discovery.Component(e.component), Version: e.version, Source: "event"}

		running := make([]kube.Running, 0, len(state))
		for _, r := range state {
			running = append(running, r)
		}

		for _, v := range stages.JudgeInvariant(running).SkewLines() {
			broken = append(broken, fmt.Sprintf("event %d: %s", i, v))
		}
	}

	return broken
}

// fakeTalos is the fake cluster's Talos API, by node IP.
type fakeTalos fakeCluster

func (ft *fakeTalos) f() *fakeCluster { return (*fakeCluster)(ft) }

func (ft *fakeTalos) Version(_ context.Context, ip string) (string, error) {
	return ft.f().machine(ip).talos, nil
}

func (ft *fakeTalos) MachineConfig(_ context.Context, ip string) (config.Provider, error) {
	f := ft.f()
	m := f.machine(ip)

	f.mu.Lock()
	defer f.mu.Unlock()

	return m.active, nil
}

func (ft *fakeTalos) PersistentMachineConfig(_ context.Context, ip string) (config.Provider, error) {
	f := ft.f()
	m := f.machine(ip)

	f.mu.Lock()
	defer f.mu.Unlock()

	return m.persistent, nil
}

func (ft *fakeTalos) Apply(ctx context.Context, ip string, data []byte, dryRun bool) (talos.ApplyResult, error) {
	f := ft.f()
	m := f.machine(ip)

	if _, ok := ctx.Deadline(); !ok {
		return talos.ApplyResult{}, errors.New("fake talos: an apply without its own deadline")
	}

	if err := ctx.Err(); err != nil {
		return talos.ApplyResult{}, err
	}

	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return talos.ApplyResult{}, fmt.Errorf("fake talos: %w", err)
	}

	hash, err := render.Hash(cfg)
	require.NoError(f.t, err)

	call := applyCall{node: m.name, dryRun: dryRun, images: render.Images(cfg), hash: hash, failed: !dryRun && m.faults.applyBlocks}

	f.mu.Lock()
	f.applies = append(f.applies, call)
	f.mu.Unlock()

	if dryRun {
		return talos.ApplyResult{Mode: "NO_REBOOT", Details: "Dry run"}, nil
	}

	if f.beforeApply != nil {
		f.beforeApply(ctx, m)
	}

	if call.failed {
		<-ctx.Done()

		return talos.ApplyResult{}, ctx.Err()
	}

	if n := len(f.cordonedByIchor()); n > f.cordonMax {
		f.mu.Lock()
		f.cordonMax = n
		f.mu.Unlock()
	}

	f.takeConfig(m, cfg)

	return talos.ApplyResult{Mode: "NO_REBOOT", Details: "Applied configuration without a reboot"}, nil
}

func (ft *fakeTalos) PullImage(ctx context.Context, ip string, ns talos.ImageNamespace, ref string) error {
	f := ft.f()
	m := f.machine(ip)

	if f.onPull != nil {
		f.onPull(m.name, ref)
	}

	switch {
	case m.faults.pullUnsup:
		return fmt.Errorf("node %q: pull %s: %w", ip, ref, talos.ErrPullUnsupported)
	case m.faults.pullFails:
		return fmt.Errorf("node %q: pull %s: failed to resolve reference: not found", ip, ref)
	}

	if d := m.faults.pullDelay; d > 0 {
		f.mu.Lock()
		if f.pulling == nil {
			f.pulling = map[string]int{}
		}
		f.pulling[m.name]++
		f.pullingMax = max(f.pullingMax, len(f.pulling))
		f.mu.Unlock()

		defer func() {
			f.mu.Lock()
			if f.pulling[m.name]--; f.pulling[m.name] == 0 {
				delete(f.pulling, m.name)
			}
			f.mu.Unlock()
		}()

		select {
		case <-time.After(d):
		case <-ctx.Done():
			// As the Talos client says a deadline: a gRPC status, not ctx's error.
			return fmt.Errorf("node %q: pull %s: rpc error: code = DeadlineExceeded desc = context deadline exceeded", ip, ref)
		}
	}

	f.mu.Lock()
	f.pulls = append(f.pulls, fmt.Sprintf("%s %s %s", m.name, ns, ref))
	f.mu.Unlock()

	return nil
}

// Manifests renders the kube-proxy manifests from the active config, as a
// control plane does.
func (ft *fakeTalos) Manifests(_ context.Context, ip string) ([]*unstructured.Unstructured, error) {
	f := ft.f()
	m := f.machine(ip)

	f.mu.Lock()
	image := m.active.K8sProxyConfig().Image()

	if f.staleManifests != 0 {
		image = f.staleImage
		if f.staleManifests > 0 {
			f.staleManifests--
		}
	}
	f.mu.Unlock()

	docs := []string{
		`{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"kube-proxy","namespace":"kube-system"}}`,
		fmt.Sprintf(`{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"kube-proxy","namespace":"kube-system"},`+
			`"spec":{"template":{"spec":{"containers":[{"name":"kube-proxy","image":%q}]}}}}`, image),
		`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"kube-proxy"}}`,
	}

	var out []*unstructured.Unstructured

	for _, d := range docs {
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal([]byte(d), &u.Object); err != nil {
			return nil, err
		}

		out = append(out, u)
	}

	return out, nil
}

// recorder is a Progress that keeps every call and can stop the engine
// after a given number of them.
type recorder struct {
	mu     sync.Mutex
	lines  []string
	count  int
	stopAt int
	cancel context.CancelFunc
}

func (r *recorder) Stage(index, total int, name string) {
	r.add(fmt.Sprintf("stage %d/%d %s", index, total, name))
}

func (r *recorder) Node(stage, node string, phase NodePhase, message string) {
	if strings.Contains(message, "\n") {
		panic("a progress message spans lines: " + message)
	}

	r.add(fmt.Sprintf("%s %s %s: %s", stage, node, phase, message))
}

func (r *recorder) Step(stage, step, message string) {
	r.add(fmt.Sprintf("%s [%s] %s", stage, step, message))
}

func (r *recorder) StepTime(stage, step string, t StepTiming) {
	r.add(fmt.Sprintf("%s [%s] time done=%t pods=%d updated=%d maxUnavailable=%d", stage, step, t.Done, t.Pods, t.Updated, t.MaxUnavailable))
}

func (r *recorder) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.lines = append(r.lines, line)
	r.count++

	if r.stopAt > 0 && r.count == r.stopAt && r.cancel != nil {
		r.cancel()
	}
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()

	return append([]string(nil), r.lines...)
}

// with returns the recorded lines containing every one of words.
func (r *recorder) with(words ...string) []string {
	var out []string

	for _, l := range r.all() {
		ok := true

		for _, w := range words {
			if !strings.Contains(l, w) {
				ok = false
			}
		}

		if ok {
			out = append(out, l)
		}
	}

	return out
}
