package engine

import (
	"context"
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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file is a fake cluster for the engine's tests: a client-go fake
// clientset holding Nodes, mirror pods, the kube-proxy DaemonSet and its
// pods, and workloads; a fake dynamic client that takes the bootstrap
// manifests; and a fake Talos whose machines hold configs generated with
// machinery's generate package. An apply moves what the machine runs at
// once (mirror pods, the Node's kubelet version), and every move is recorded
// as an event, as the simulator's events.jsonl does, so a test can check
// the invariant at every step independently of the engine. Its Talos API is
// fake_kubernetes_talos_test.go; its objects and the clientsets' reactors are
// fake_objects_test.go and fake_reactors_test.go.

var (
	podsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	podGVK   = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	nodesGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
	nodeGVK  = schema.GroupVersionKind{Version: "v1", Kind: "Node"}
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
	// unreachable is how many more Version calls answer Unavailable (connection
	// refused), as a Talos whose apid restarts does; -1 for every one.
	unreachable int
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
	// evictGraceful makes an eviction start a graceful deletion, as the
	// apiserver does for a pod with a grace period: the pod stays, Terminating
	// (its deletionTimestamp set), until releaseEvicted deletes it. An eviction
	// of a pod already Terminating is accepted and changes nothing.
	evictGraceful bool
	terminating   []string // "node ns/name" of pods evicted and still Terminating
	// onTerminating, when set, is called after each graceful eviction.
	onTerminating func()
	// beforeApply, when set, is called before every non-dry-run apply.
	beforeApply func(ctx context.Context, m *fakeMachine)
	// refuseTalos, when set, is asked before every MachineConfig,
	// PersistentMachineConfig and dry-run apply (call names the method): true
	// answers Unavailable (connection refused), as a node whose API went away.
	refuseTalos func(node, call string) bool
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
		// Read from the tracker, not the clientset: the machine's own read is not
		// among the engine's requests (TestEngineNodeReads counts them).
		obj, err := f.cs.Tracker().Get(nodesGVR, "", m.name)
		require.NoError(f.t, err)

		node := obj.(*corev1.Node).DeepCopy()

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
	// From the tracker: not among the engine's requests.
	obj, err := f.cs.Tracker().List(nodesGVR, nodeGVK, "")
	require.NoError(f.t, err)

	var out []string

	for _, n := range obj.(*corev1.NodeList).Items {
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
