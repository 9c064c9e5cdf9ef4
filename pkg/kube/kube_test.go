package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// Builders.

func node(name, kubelet string, ready bool) *corev1.Node {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}

	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: kubelet},
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: status, Reason: "KubeletNotReady", Message: "kubelet is restarting",
			}},
		},
	}
}

func staticPod(node string, comp discovery.Component, tag string, ready bool) *corev1.Pod {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}

	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: string(comp) + "-" + node,
			Labels:      map[string]string{discovery.ComponentLabel: string(comp)},
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: string(comp), Image: "registry.k8s.io/" + string(comp) + ":" + tag}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func ownedPod(ns, name, node, kind string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}

	if kind != "" {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "owner", Controller: new(true)}}
	}

	return p
}

func startCache(t *testing.T, cs *fake.Clientset) *Cache {
	t.Helper()

	nodes, err := StartNodes(t.Context(), cs)
	require.NoError(t, err)
	t.Cleanup(nodes.Stop)

	c, err := StartCache(t.Context(), cs, nodes)
	require.NoError(t, err)
	t.Cleanup(c.Stop)

	return c
}

func TestCacheWait(t *testing.T) {
	cs := fake.NewClientset(node("cp-1", "v1.35.4", false), staticPod("cp-1", discovery.APIServer, "v1.35.4", true))
	c := startCache(t, cs)
	cond := c.NodeVerified(NodeExpect{Node: "cp-1", KubeletVersion: "v1.36.3", StaticPods: map[discovery.Component]string{discovery.APIServer: "v1.36.3"}})

	t.Run("times out saying what it waited for", func(t *testing.T) {
		var reports []string

		err := c.Wait(t.Context(), 20*time.Millisecond, cond, func(w string) { reports = append(reports, w) })

		var timeout *WaitTimeoutError
		require.ErrorAs(t, err, &timeout)
		assert.Equal(t, "node NotReady (KubeletNotReady: kubelet is restarting); kubelet v1.35.4, want v1.36.3; "+
			"kube-apiserver-cp-1 on v1.35.4, want v1.36.3", timeout.Waiting)
		assert.Equal(t, []string{timeout.Waiting}, reports)
		assert.Contains(t, err.Error(), "not done after 20ms")
	})

	t.Run("ends when the cluster gets there", func(t *testing.T) {
		go func() {
			ctx := context.Background()

			p := staticPod("cp-1", discovery.APIServer, "v1.36.3", true)
			_, _ = cs.CoreV1().Pods("kube-system").Update(ctx, p, metav1.UpdateOptions{})
			_, _ = cs.CoreV1().Nodes().UpdateStatus(ctx, node("cp-1", "v1.36.3", true), metav1.UpdateOptions{})
		}()

		var mu sync.Mutex

		var reports []string

		require.NoError(t, c.Wait(t.Context(), time.Minute, cond, func(w string) {
			mu.Lock()
			defer mu.Unlock()

			reports = append(reports, w)
		}))
		assert.NotEmpty(t, reports)
	})

	t.Run("reports again while nothing changes", func(t *testing.T) {
		beats := &Cache{nodes: c.nodes, pods: c.pods, daemonSets: c.daemonSets, heartbeat: time.Millisecond, waiters: map[int]chan struct{}{}}

		var reports []string

		err := beats.Wait(t.Context(), time.Minute, func() (bool, string) { return len(reports) >= 3, "still" }, func(w string) {
			reports = append(reports, w)
		})
		require.NoError(t, err)
		assert.Equal(t, []string{"still", "still", "still"}, reports)
	})

	t.Run("stops with its context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()

		err := c.Wait(ctx, time.Minute, func() (bool, string) { return false, "never" }, nil)
		require.ErrorIs(t, err, context.Canceled)
	})
}

func TestNodeVerified(t *testing.T) {
	want := NodeExpect{Node: "cp-1", StaticPods: map[discovery.Component]string{
		discovery.APIServer: "v1.36.3", discovery.Scheduler: "v1.36.3",
	}}

	for _, tc := range []struct {
		name    string
		objs    []runtime.Object
		expect  NodeExpect
		waiting string // "" when verified
	}{
		{
			name: "verified",
			objs: []runtime.Object{
				node("cp-1", "v1.35.4", true),
				staticPod("cp-1", discovery.APIServer, "v1.36.3", true),
				staticPod("cp-1", discovery.Scheduler, "v1.36.3", true),
				staticPod("cp-2", discovery.Scheduler, "v1.35.4", false),
			},
			expect: want,
		},
		{
			name:    "no node",
			expect:  want,
			waiting: "no Node cp-1",
		},
		{
			name: "a pod not Ready, another missing",
			objs: []runtime.Object{
				node("cp-1", "v1.35.4", true),
				staticPod("cp-1", discovery.APIServer, "v1.36.3", false),
			},
			expect:  want,
			waiting: "kube-apiserver-cp-1 on v1.36.3 not Ready; no kube-scheduler mirror pod on cp-1",
		},
		{
			name:    "kubelet version",
			objs:    []runtime.Object{node("worker-1", "v1.35.4", true)},
			expect:  NodeExpect{Node: "worker-1", KubeletVersion: "v1.36.3"},
			waiting: "kubelet v1.35.4, want v1.36.3",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCache(t, fake.NewClientset(tc.objs...))
			done, waiting := c.NodeVerified(tc.expect)()
			assert.Equal(t, tc.waiting == "", done)
			assert.Equal(t, tc.waiting, waiting)
		})
	}
}

func TestDaemonSetRollout(t *testing.T) {
	ds := func(image string, gen, observed int64, desired, updated, available int32) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system", Generation: gen},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
				{Name: "sidecar", Image: "busybox"}, {Name: "kube-proxy", Image: image},
			}}}},
			Status: appsv1.DaemonSetStatus{
				ObservedGeneration: observed, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberAvailable: available,
			},
		}
	}

	const image = "registry.k8s.io/kube-proxy:v1.36.3"

	for _, tc := range []struct {
		name string
		ds   *appsv1.DaemonSet
		done bool
		msg  string
	}{
		{"old image", ds("registry.k8s.io/kube-proxy:v1.35.4", 1, 1, 5, 5, 5), false, "DaemonSet kube-proxy runs registry.k8s.io/kube-proxy:v1.35.4, want v1.36.3"},
		{"not observed", ds(image, 2, 1, 5, 5, 5), false, "DaemonSet kube-proxy: generation 2 not yet observed"},
		{"rolling", ds(image, 2, 2, 5, 3, 4), false, "DaemonSet kube-proxy: 3 of 5 pods updated to v1.36.3"},
		{"not available", ds(image, 2, 2, 5, 5, 4), false, "DaemonSet kube-proxy: 4 of 5 updated pods available"},
		{"done", ds(image, 2, 2, 5, 5, 5), true, "DaemonSet kube-proxy: 5 of 5 pods on v1.36.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, msg := DaemonSetRollout(tc.ds, "kube-proxy", "v1.36.3")
			assert.Equal(t, tc.done, done)
			assert.Equal(t, tc.msg, msg)
		})
	}

	c := startCache(t, fake.NewClientset())
	done, msg := c.DaemonSetRolledOut("kube-proxy", "kube-proxy", "v1.36.3")()
	assert.False(t, done)
	assert.Equal(t, "no DaemonSet kube-system/kube-proxy", msg)
}

func TestCordon(t *testing.T) {
	cs := fake.NewClientset(node("worker-1", "v1.35.4", true))
	ctx := t.Context()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

	require.NoError(t, Cordon(ctx, cs, "worker-1", now))

	n, err := cs.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, n.Spec.Unschedulable)
	assert.True(t, CordonedByIchor(n))
	assert.Equal(t, "2026-11-29T12:00:00Z", n.Annotations[CordonedAnnotation])

	require.NoError(t, Uncordon(ctx, cs, "worker-1"))

	n, err = cs.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, n.Spec.Unschedulable)
	assert.False(t, CordonedByIchor(n))

	require.ErrorContains(t, Cordon(ctx, cs, "nope", now), `node "nope": cordon:`)
}

// drainCluster is a fake clientset that serves a drain: LISTs of a node's
// pods by field, and evictions that delete the pod (or a budget that refuses).
func drainCluster(t *testing.T, refuse bool, objs ...runtime.Object) *fake.Clientset {
	t.Helper()

	cs := fake.NewClientset(objs...)
	cs.Resources = []*metav1.APIResourceList{{GroupVersion: "v1", APIResources: []metav1.APIResource{
		{Name: "pods", Namespaced: true, Kind: "Pod"},
		{Name: "pods/eviction", Namespaced: true, Kind: "Eviction", Group: "policy", Version: "v1"},
	}}}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}

	cs.PrependReactor("list", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		list, _ := action.(k8stesting.ListActionImpl)
		if list.ListRestrictions.Fields == nil || list.ListRestrictions.Fields.Empty() {
			return false, nil, nil
		}

		obj, err := cs.Tracker().List(gvr, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, "")
		require.NoError(t, err)

		out := &corev1.PodList{}
		for _, p := range obj.(*corev1.PodList).Items {
			if list.ListRestrictions.Fields.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) && list.ListRestrictions.Labels.Matches(labels.Set(p.Labels)) {
				out.Items = append(out.Items, p)
			}
		}

		return true, out, nil
	})
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		create, _ := action.(k8stesting.CreateActionImpl)
		if create.GetSubresource() != "eviction" {
			return false, nil, nil
		}

		if refuse {
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}

		ev := create.GetObject().(*policyv1.Eviction)

		return true, nil, cs.Tracker().Delete(gvr, ev.Namespace, ev.Name)
	})

	return cs
}

func TestDrain(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "owner"}}

	t.Run("evicts the workloads, leaves DaemonSet and mirror pods", func(t *testing.T) {
		cs := drainCluster(t, false,
			node("worker-1", "v1.35.4", true), ds,
			ownedPod("default", "web-1", "worker-1", "ReplicaSet"),
			ownedPod("default", "web-2", "worker-1", "ReplicaSet"),
			ownedPod("default", "web-3", "worker-2", "ReplicaSet"),
			ownedPod("kube-system", "kube-proxy-x", "worker-1", "DaemonSet"),
			staticPod("worker-1", discovery.APIServer, "v1.35.4", true),
		)

		var evicted []string

		n, err := Drainer{Client: cs, Timeout: time.Minute, OnEvicted: func(p string) { evicted = append(evicted, p) }}.Drain(t.Context(), "worker-1")
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.ElementsMatch(t, []string{"default/web-1", "default/web-2"}, evicted)

		pods, err := cs.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{})
		require.NoError(t, err)

		var left []string
		for _, p := range pods.Items {
			left = append(left, p.Name)
		}

		assert.ElementsMatch(t, []string{"web-3", "kube-proxy-x", "kube-apiserver-worker-1"}, left)
	})

	t.Run("a budget that refuses until the bound", func(t *testing.T) {
		cs := drainCluster(t, true, node("worker-1", "v1.35.4", true), ownedPod("default", "web-1", "worker-1", "ReplicaSet"))

		_, err := Drainer{Client: cs, Timeout: 50 * time.Millisecond, EvictRetryDelay: time.Millisecond}.Drain(t.Context(), "worker-1")
		require.Error(t, err)
		assert.Contains(t, err.Error(), `node "worker-1": drain:`)
		assert.Contains(t, err.Error(), "global timeout reached")
		assert.Contains(t, err.Error(), "(last: error when evicting pods/\"web-1\" -n \"default\"")
		assert.Contains(t, err.Error(), "disruption budget")
	})

	t.Run("a pod with no controller", func(t *testing.T) {
		cs := drainCluster(t, false, node("worker-1", "v1.35.4", true), ownedPod("default", "debug", "worker-1", ""))

		_, err := Drainer{Client: cs, Timeout: time.Minute}.Drain(t.Context(), "worker-1")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "default/debug")
		assert.Contains(t, err.Error(), "declare no controller")
	})

	t.Run("done the moment the last pod is gone", func(t *testing.T) {
		cs := drainCluster(t, false, node("worker-1", "v1.35.4", true))
		gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}

		// Evictions that start a graceful deletion: the pods go 300ms later.
		for _, name := range []string{"web-1", "web-2"} {
			p := ownedPod("default", name, "worker-1", "ReplicaSet")
			p.UID = types.UID("uid-" + name)
			require.NoError(t, cs.Tracker().Add(p))
		}

		cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
			create, _ := action.(k8stesting.CreateActionImpl)
			if create.GetSubresource() != "eviction" {
				return false, nil, nil
			}

			ev := create.GetObject().(*policyv1.Eviction)
			time.AfterFunc(300*time.Millisecond, func() { _ = cs.Tracker().Delete(gvr, ev.Namespace, ev.Name) })

			return true, nil, nil
		})

		start := time.Now()
		n, err := Drainer{Client: cs, Timeout: time.Minute}.Drain(t.Context(), "worker-1")
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		assert.Less(t, time.Since(start), 900*time.Millisecond, "a watch sees the deletions; no poll of a second")
	})

	t.Run("the runner's own pod last, once the others are gone", func(t *testing.T) {
		cs := drainCluster(t, false, node("worker-1", "v1.35.4", true))

		for _, p := range []*corev1.Pod{
			ownedPod("ichor-system", "run-abcde", "worker-1", "Job"),
			ownedPod("default", "web-1", "worker-1", "ReplicaSet"),
			ownedPod("default", "web-2", "worker-1", "ReplicaSet"),
		} {
			p.UID = types.UID("uid-" + p.Name)
			require.NoError(t, cs.Tracker().Add(p))
		}

		// Evictions that start a graceful deletion: the pods go 100ms later.
		log := evictGracefully(cs, func() { time.Sleep(100 * time.Millisecond) })

		n, err := Drainer{Client: cs, Timeout: time.Minute, Last: "ichor-system/run-abcde"}.Drain(t.Context(), "worker-1")
		require.NoError(t, err)
		assert.Equal(t, 3, n)

		events := log.all()
		require.Len(t, events, 6)
		assert.ElementsMatch(t, []string{"evict web-1", "evict web-2", "gone web-1", "gone web-2"}, events[:4])
		assert.Equal(t, []string{"evict run-abcde", "gone run-abcde"}, events[4:])
	})

	t.Run("Accepted once every eviction is accepted, before the pods are gone", func(t *testing.T) {
		cs := drainCluster(t, false, node("worker-1", "v1.35.4", true))

		for _, name := range []string{"web-1", "web-2", "web-3"} {
			p := ownedPod("default", name, "worker-1", "ReplicaSet")
			p.UID = types.UID("uid-" + name)
			require.NoError(t, cs.Tracker().Add(p))
		}

		// Evictions that start a graceful deletion: the pods go once the
		// drain said it was accepted (or after a second, which fails the test).
		accepted := make(chan struct{})
		log := evictGracefully(cs, func() {
			select {
			case <-accepted:
			case <-time.After(time.Second):
			}
		})

		calls := 0
		n, err := Drainer{Client: cs, Timeout: time.Minute, Accepted: func() {
			calls++
			log.add("accepted")
			close(accepted)
		}}.Drain(t.Context(), "worker-1")
		require.NoError(t, err)
		assert.Equal(t, 3, n)
		assert.Equal(t, 1, calls)

		events := log.all()
		require.Len(t, events, 7)
		assert.ElementsMatch(t, []string{"evict web-1", "evict web-2", "evict web-3"}, events[:3])
		assert.Equal(t, "accepted", events[3], "said before any pod is gone")
	})

	t.Run("no Accepted while a budget refuses an eviction", func(t *testing.T) {
		cs := drainCluster(t, true, node("worker-1", "v1.35.4", true), ownedPod("default", "web-1", "worker-1", "ReplicaSet"))

		called := false
		_, err := Drainer{Client: cs, Timeout: 50 * time.Millisecond, EvictRetryDelay: time.Millisecond, Accepted: func() { called = true }}.Drain(t.Context(), "worker-1")
		require.Error(t, err)
		assert.False(t, called)
	})

	t.Run("the kept pod is never evicted", func(t *testing.T) {
		cs := drainCluster(t, true, node("worker-1", "v1.35.4", true),
			ownedPod("ichor-system", "run-abcde", "worker-1", "Job"), ownedPod("default", "web-1", "worker-1", "ReplicaSet"))

		var evicted []string

		cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
			create, _ := action.(k8stesting.CreateActionImpl)
			if create.GetSubresource() != "eviction" {
				return false, nil, nil
			}

			ev := create.GetObject().(*policyv1.Eviction)
			evicted = append(evicted, ev.Name)

			return true, nil, cs.Tracker().Delete(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, ev.Namespace, ev.Name)
		})

		n, err := Drainer{Client: cs, Timeout: time.Minute, Keep: "ichor-system/run-abcde"}.Drain(t.Context(), "worker-1")
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		assert.Equal(t, []string{"web-1"}, evicted)

		_, err = cs.CoreV1().Pods("ichor-system").Get(t.Context(), "run-abcde", metav1.GetOptions{})
		require.NoError(t, err, "the runner's pod stays")
	})

	t.Run("stopped by its context", func(t *testing.T) {
		cs := drainCluster(t, true, node("worker-1", "v1.35.4", true), ownedPod("default", "web-1", "worker-1", "ReplicaSet"))
		ctx, cancel := context.WithCancel(t.Context())

		time.AfterFunc(20*time.Millisecond, cancel)

		_, err := Drainer{Client: cs, Timeout: time.Minute, EvictRetryDelay: time.Millisecond}.Drain(ctx, "worker-1")
		require.ErrorIs(t, err, context.Canceled)
	})
}

// drainLog is a drain test's record of what happened, in order.
type drainLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *drainLog) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

func (l *drainLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()

	return slices.Clone(l.lines)
}

// evictGracefully makes cs's evictions start a graceful deletion, as the
// apiserver does for a pod with a grace period: each is recorded ("evict
// name"), and its pod goes ("gone name") once stop returns.
func evictGracefully(cs *fake.Clientset, stop func()) *drainLog {
	log := &drainLog{}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "pods"}

	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		create, _ := action.(k8stesting.CreateActionImpl)
		if create.GetSubresource() != "eviction" {
			return false, nil, nil
		}

		ev := create.GetObject().(*policyv1.Eviction)
		log.add("evict " + ev.Name)

		go func() {
			stop()
			log.add("gone " + ev.Name)
			_ = cs.Tracker().Delete(gvr, ev.Namespace, ev.Name)
		}()

		return true, nil, nil
	})

	return log
}

func TestManifestApplier(t *testing.T) {
	cs := fake.NewClientset()
	cs.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "namespaces", Kind: "Namespace"},
			{Name: "configmaps", Namespaced: true, Kind: "ConfigMap"},
		}},
		{GroupVersion: "apiextensions.k8s.io/v1", APIResources: []metav1.APIResource{
			{Name: "customresourcedefinitions", Kind: "CustomResourceDefinition"},
		}},
	}

	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())

	var applied []string

	dyn.PrependReactor("patch", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		p := action.(k8stesting.PatchActionImpl)
		applied = append(applied, fmt.Sprintf("%s %s %s/%s manager=%s force=%t",
			p.GetPatchType(), p.GetResource().Resource, p.GetNamespace(), p.GetName(), p.PatchOptions.FieldManager, *p.PatchOptions.Force))

		return true, &unstructured.Unstructured{}, nil
	})

	obj := func(apiVersion, kind, ns, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(apiVersion)
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName(name)

		return u
	}

	a := NewManifestApplier(dyn, cs.Discovery())
	n, err := a.Apply(t.Context(), []*unstructured.Unstructured{
		obj("v1", "ConfigMap", "", "no-namespace"),
		obj("v1", "ConfigMap", "kube-system", "coredns"),
		obj("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "things.example.com"),
		obj("v1", "Namespace", "", "extra"),
	})
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Equal(t, []string{
		"application/apply-patch+yaml namespaces /extra manager=talos force=true",
		"application/apply-patch+yaml customresourcedefinitions /things.example.com manager=talos force=true",
		"application/apply-patch+yaml configmaps default/no-namespace manager=talos force=true",
		"application/apply-patch+yaml configmaps kube-system/coredns manager=talos force=true",
	}, applied)

	n, err = a.Apply(t.Context(), []*unstructured.Unstructured{obj("v1", "ConfigMap", "a", "b"), obj("example.com/v1", "Thing", "a", "x")})
	require.Error(t, err)
	assert.Equal(t, 1, n)
	assert.Contains(t, err.Error(), "apply Thing a/x:")
}

func TestObserve(t *testing.T) {
	done := staticPod("cp-1", discovery.Scheduler, "v1.34.0", false)
	done.Status.Phase = corev1.PodSucceeded

	proxy := ownedPod("kube-system", "kube-proxy-abc", "worker-1", "DaemonSet")
	proxy.Labels = map[string]string{discovery.ComponentLabel: "kube-proxy"}
	proxy.Spec.Containers = []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:v1.36.3"}}

	cp1, cp2 := node("cp-1", "v1.35.4", true), node("cp-2", "v1.35.4", true)
	cp1.Labels = map[string]string{discovery.ControlPlaneLabel: ""}
	cp2.Labels = map[string]string{discovery.ControlPlaneLabel: ""}

	cs := fake.NewClientset(
		cp1, cp2, node("worker-1", "v1.35.4", true),
		staticPod("cp-1", discovery.APIServer, "v1.36.3", true), done, proxy,
		ownedPod("kube-system", "coredns", "worker-1", "ReplicaSet"),
	)

	running, err := Observe(t.Context(), cs)
	require.NoError(t, err)
	assert.Equal(t, []Running{
		{Node: "cp-1", Component: discovery.APIServer, Version: "v1.36.3", Image: "registry.k8s.io/kube-apiserver:v1.36.3", Source: "pod kube-system/kube-apiserver-cp-1"},
		{Node: "cp-1", Component: discovery.Kubelet, Version: "v1.35.4", Source: "Node cp-1"},
		// A control plane without an apiserver mirror pod: its version is unknown, not left out.
		{Node: "cp-2", Component: discovery.APIServer, Source: "no kube-apiserver mirror pod in kube-system on control plane cp-2"},
		{Node: "cp-2", Component: discovery.Kubelet, Version: "v1.35.4", Source: "Node cp-2"},
		{Node: "worker-1", Component: discovery.KubeProxy, Version: "v1.36.3", Image: "registry.k8s.io/kube-proxy:v1.36.3", Source: "pod kube-system/kube-proxy-abc"},
		{Node: "worker-1", Component: discovery.Kubelet, Version: "v1.35.4", Source: "Node worker-1"},
	}, running)
}

func TestRetry(t *testing.T) {
	for _, tc := range []struct {
		err       error
		transient bool
	}{
		{apierrors.NewServiceUnavailable("restarting"), true},
		{apierrors.NewTimeoutError("slow", 1), true},
		{apierrors.NewInternalError(errors.New("etcd")), true},
		{fmt.Errorf("get: %w", syscall.ECONNREFUSED), true},
		{&net.OpError{Op: "dial", Err: errors.New("no route")}, true},
		{apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "x"), false},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "x", errors.New("rbac")), false},
		{apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "x", errors.New("changed")), false},
		{errors.New("something else"), false},
	} {
		t.Run(strings.SplitN(tc.err.Error(), ":", 2)[0], func(t *testing.T) {
			assert.Equal(t, tc.transient, IsTransient(tc.err))
		})
	}

	t.Run("retries what is temporary", func(t *testing.T) {
		calls := 0
		err := Retry(t.Context(), time.Minute, func(context.Context) error {
			if calls++; calls < 3 {
				return apierrors.NewServiceUnavailable("restarting")
			}

			return nil
		})
		require.NoError(t, err)
		assert.Equal(t, 3, calls)
	})

	t.Run("not the rest", func(t *testing.T) {
		calls := 0
		err := Retry(t.Context(), time.Minute, func(context.Context) error {
			calls++

			return apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "x")
		})
		require.True(t, apierrors.IsNotFound(err))
		assert.Equal(t, 1, calls)
	})

	t.Run("within its bound", func(t *testing.T) {
		err := Retry(t.Context(), time.Millisecond, func(context.Context) error {
			return apierrors.NewServiceUnavailable("restarting")
		})
		require.True(t, apierrors.IsServiceUnavailable(err))
	})
}

// Sync dry-runs every object first; an object whose Namespace the set itself creates is
// judged at the real apply; a conflict skips its object; a refusal stops everything
// before the first real apply.
func TestManifestSync(t *testing.T) {
	cs := fake.NewClientset()
	cs.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "namespaces", Kind: "Namespace"},
			{Name: "configmaps", Namespaced: true, Kind: "ConfigMap"},
		}},
	}

	obj := func(kind, ns, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName(name)

		return u
	}

	objs := []*unstructured.Unstructured{
		obj("ConfigMap", "kube-system", "coredns"), obj("ConfigMap", "cni", "cni-config"),
		obj("ConfigMap", "kube-system", "helm-owned"), obj("Namespace", "", "cni"),
	}

	run := func(t *testing.T, forbidden string, opts SyncOptions) ([]string, *SyncResult, error) {
		t.Helper()

		dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())

		var calls []string

		dyn.PrependReactor("patch", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
			p := action.(k8stesting.PatchActionImpl)
			dry := len(p.PatchOptions.DryRun) > 0
			calls = append(calls, fmt.Sprintf("dry=%t %s/%s force=%t", dry, p.GetNamespace(), p.GetName(), *p.PatchOptions.Force))

			gr := schema.GroupResource{Resource: p.GetResource().Resource}

			switch {
			case p.GetName() == forbidden:
				return true, nil, apierrors.NewForbidden(gr, p.GetName(), errors.New("no"))
			case p.GetNamespace() == "cni" && dry:
				return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "cni")
			case p.GetName() == "helm-owned" && !*p.PatchOptions.Force:
				return true, nil, apierrors.NewApplyConflict(nil, `Apply failed with 1 conflict: conflict with "helm": .data.x`)
			}

			return true, &unstructured.Unstructured{}, nil
		})

		res, err := NewManifestApplier(dyn, cs.Discovery()).Sync(t.Context(), objs, opts)

		return calls, res, err
	}

	t.Run("a conflict is skipped", func(t *testing.T) {
		calls, res, err := run(t, "", SyncOptions{})
		require.NoError(t, err)
		assert.Equal(t, []string{"Namespace cni", "ConfigMap kube-system/coredns", "ConfigMap cni/cni-config"}, res.Applied)
		assert.Equal(t, []Skipped{{Object: "ConfigMap kube-system/helm-owned", Conflict: `Apply failed with 1 conflict: conflict with "helm": .data.x`}}, res.Skipped)
		assert.Equal(t, []string{
			"dry=true /cni force=false", "dry=true kube-system/coredns force=false", "dry=true cni/cni-config force=false", "dry=true kube-system/helm-owned force=false",
			"dry=false /cni force=false", "dry=false kube-system/coredns force=false", "dry=false cni/cni-config force=false",
		}, calls)
	})

	t.Run("forced, it is taken over", func(t *testing.T) {
		_, res, err := run(t, "", SyncOptions{Force: []string{"ConfigMap kube-system/helm-owned"}})
		require.NoError(t, err)
		assert.Contains(t, res.Applied, "ConfigMap kube-system/helm-owned")
		assert.Empty(t, res.Skipped)
	})

	t.Run("a refusal applies nothing", func(t *testing.T) {
		calls, res, err := run(t, "coredns", SyncOptions{Force: []string{ForceAll}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "dry-run apply ConfigMap kube-system/coredns: ")
		assert.Empty(t, res.Applied)

		for _, c := range calls {
			assert.Contains(t, c, "dry=true")
		}
	})
}

// TestDrainerLeft counts the pods a drain would still evict that run: not
// DaemonSet or mirror pods, not Keep, not a pod that ended (its containers
// stopped: a runner that handed over and exited).
func TestDrainerLeft(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "owner"}}
	ended := ownedPod("ichor-system", "runner-1", "worker-1", "Job")
	ended.Status.Phase = corev1.PodFailed
	evicted := ownedPod("default", "web-3", "worker-2", "ReplicaSet")
	evicted.DeletionTimestamp = &metav1.Time{Time: time.Now()}

	cs := drainCluster(t, false,
		node("worker-1", "v1.35.4", true), ds,
		ownedPod("ichor-system", "runner-2", "worker-1", "Job"),
		ownedPod("default", "came-late", "worker-1", "ReplicaSet"),
		evicted,
		ownedPod("kube-system", "kube-proxy-x", "worker-1", "DaemonSet"),
		staticPod("worker-1", discovery.APIServer, "v1.35.4", true),
		ended,
	)

	n, stopping, err := Drainer{Client: cs, Timeout: time.Minute}.Left(t.Context(), "worker-1")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "runner-2 and came-late")
	assert.Zero(t, stopping)

	n, _, err = Drainer{Client: cs, Keep: "ichor-system/runner-2", Timeout: time.Minute}.Left(t.Context(), "worker-1")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "came-late")

	n, stopping, err = Drainer{Client: cs, Timeout: time.Minute}.Left(t.Context(), "worker-2")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "web-3")
	assert.Equal(t, 1, stopping, "web-3, evicted, is being deleted")
}

// TestDrainerLeftIsBounded: the list before a reboot ends at the drain's
// bound on an API server that does not answer, saying so.
func TestDrainerLeftIsBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)

	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	_, _, err = Drainer{Client: cs, Timeout: 100 * time.Millisecond}.Left(ctx, "worker-1")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `node "worker-1": drain: global timeout reached: 100ms`)
}
