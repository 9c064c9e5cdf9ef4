package kube

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// laggingNodes is an API server of Nodes whose watch delivers only what a test
// sends it: the watch can be made to lag behind a write. It counts the requests.
type laggingNodes struct {
	cs    *fake.Clientset
	watch *watch.FakeWatcher

	mu        sync.Mutex
	node      *corev1.Node // the API server's truth
	requests  map[string]int
	conflicts int
}

func newLaggingNodes(t *testing.T, n *corev1.Node) *laggingNodes {
	t.Helper()

	l := &laggingNodes{cs: fake.NewClientset(), watch: watch.NewFakeWithChanSize(10, false), node: n, requests: map[string]int{}}

	l.cs.PrependWatchReactor("nodes", func(k8stesting.Action) (bool, watch.Interface, error) {
		l.count("watch")

		return true, l.watch, nil
	})
	l.cs.PrependReactor("*", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l.count(a.GetVerb())

		l.mu.Lock()
		defer l.mu.Unlock()

		switch a.GetVerb() {
		case "list":
			return true, &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: l.node.ResourceVersion}, Items: []corev1.Node{*l.node.DeepCopy()}}, nil
		case "get":
			return true, l.node.DeepCopy(), nil
		case "patch":
			// A merge patch of the cordon, its resourceVersion a precondition, as the API
			// server takes it.
			p, ok := a.(k8stesting.PatchAction)
			require.True(t, ok)

			var patch struct {
				Metadata struct {
					ResourceVersion string             `json:"resourceVersion"`
					Annotations     map[string]*string `json:"annotations"`
				} `json:"metadata"`
				Spec struct {
					Unschedulable *bool `json:"unschedulable"`
				} `json:"spec"`
			}
			require.NoError(t, json.Unmarshal(p.GetPatch(), &patch))

			if rv := patch.Metadata.ResourceVersion; rv != "" && rv != l.node.ResourceVersion {
				l.conflicts++

				return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), l.node.Name, errors.New("the object has been modified"))
			}

			n := l.node.DeepCopy()

			for k, v := range patch.Metadata.Annotations {
				switch {
				case v == nil:
					delete(n.Annotations, k)
				case n.Annotations == nil:
					n.Annotations = map[string]string{k: *v}
				default:
					n.Annotations[k] = *v
				}
			}

			if patch.Spec.Unschedulable != nil {
				n.Spec.Unschedulable = *patch.Spec.Unschedulable
			}

			n.ResourceVersion = next(n.ResourceVersion)
			l.node = n

			return true, n.DeepCopy(), nil
		}

		return false, nil, nil
	})

	return l
}

// next is the resourceVersion after rv: the next integer, or rv with "1" added when
// it is not one.
func next(rv string) string {
	if v, err := strconv.Atoi(rv); err == nil {
		return strconv.Itoa(v + 1)
	}

	return rv + "1"
}

func (l *laggingNodes) count(verb string) {
	l.mu.Lock()
	defer l.mu.Unlock()

	l.requests[verb]++
}

func (l *laggingNodes) gets() int {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.requests["get"]
}

// deliver sends the watch the API server's Node as it is now.
func (l *laggingNodes) deliver() {
	l.mu.Lock()
	n := l.node.DeepCopy()
	l.mu.Unlock()

	l.watch.Modify(n)
}

func cordonNode(rv string) *corev1.Node {
	n := node("worker-1", "v1.36.3", true)
	n.ResourceVersion = rv

	return n
}

func startNodes(t *testing.T, l *laggingNodes, catchUp time.Duration) *Nodes {
	t.Helper()

	n, err := StartNodes(t.Context(), l.cs)
	require.NoError(t, err)
	t.Cleanup(n.Stop)

	n.catchUp = catchUp

	return n
}

func TestNodesGetAnswersFromTheWatch(t *testing.T) {
	l := newLaggingNodes(t, cordonNode("9"))
	n := startNodes(t, l, time.Minute)

	for range 5 {
		got, err := n.Get(t.Context(), "worker-1")
		require.NoError(t, err)
		assert.Equal(t, "v1.36.3", got.Status.NodeInfo.KubeletVersion)
	}

	assert.Equal(t, 0, l.gets(), "no Node GET: the watch answers")
	assert.Equal(t, 1, l.requests["list"])
}

// A watch that lags behind the runner's own cordon cannot make the runner read the
// Node uncordoned: Get waits for the watch (bounded), then asks the API server.
func TestNodesGetNeverOlderThanOwnWrite(t *testing.T) {
	ctx := t.Context()
	l := newLaggingNodes(t, cordonNode("9"))
	n := startNodes(t, l, 100*time.Millisecond)

	_, err := n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)

	cached, ok := n.Cached("worker-1")
	require.True(t, ok)
	require.False(t, CordonedByIchor(cached), "the watch has not seen the cordon yet")

	got, err := n.Get(ctx, "worker-1")
	require.NoError(t, err)
	assert.True(t, CordonedByIchor(got), "Get shows the runner's own cordon")
	assert.Equal(t, 1, l.gets(), "the lagging watch was not trusted: one GET")

	// Once the watch shows the cordon, Get answers from it again.
	l.deliver()

	require.Eventually(t, func() bool {
		c, _ := n.Cached("worker-1")

		return c.ResourceVersion == "10"
	}, 5*time.Second, 5*time.Millisecond)

	got, err = n.Get(ctx, "worker-1")
	require.NoError(t, err)
	assert.True(t, CordonedByIchor(got))
	assert.Equal(t, 1, l.gets(), "no GET once the watch caught up")
}

// A Get that waits is woken by the watch event it waits for, with no request.
func TestNodesGetWaitsForTheWatch(t *testing.T) {
	ctx := t.Context()
	l := newLaggingNodes(t, cordonNode("9"))
	n := startNodes(t, l, time.Minute)

	_, err := n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)
	require.NoError(t, n.Uncordon(ctx, "worker-1"))

	go func() {
		time.Sleep(50 * time.Millisecond)
		l.watch.Modify(func() *corev1.Node { c := cordonNode("10"); c.Spec.Unschedulable = true; return c }())
		time.Sleep(50 * time.Millisecond)
		l.deliver() // rv 11: the uncordon
	}()

	start := time.Now()
	got, err := n.Get(ctx, "worker-1")
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Equal(t, "11", got.ResourceVersion, "not the cordon (10): the uncordon after it")
	assert.False(t, got.Spec.Unschedulable)
	assert.Equal(t, 0, l.gets())
}

// ReadCordon decides whether to cordon: always from the API server, even when the
// watch has the Node.
func TestNodesReadCordonAsksTheAPIServer(t *testing.T) {
	ctx := t.Context()
	l := newLaggingNodes(t, cordonNode("9"))
	n := startNodes(t, l, time.Minute)

	_, err := n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)
	l.deliver()

	// Someone runs kubectl uncordon; the watch has not seen it.
	l.mu.Lock()
	l.node.Spec.Unschedulable = false
	l.node.ResourceVersion = "11"
	l.mu.Unlock()

	state, err := n.ReadCordon(ctx, "worker-1")
	require.NoError(t, err)
	assert.Equal(t, MarkedButSchedulable, state)
	assert.Equal(t, 1, l.gets())

	// Get does not go back from what it read: it answers once the watch shows it.
	go func() {
		time.Sleep(50 * time.Millisecond)
		l.deliver()
	}()

	got, err := n.Get(ctx, "worker-1")
	require.NoError(t, err)
	assert.False(t, got.Spec.Unschedulable)
	assert.Equal(t, "11", got.ResourceVersion)
	assert.Equal(t, 1, l.gets(), "answered by the watch")
}

// Versions that do not compare (a storage other than etcd) are not trusted.
func TestNodesGetIncomparableVersions(t *testing.T) {
	ctx := t.Context()
	l := newLaggingNodes(t, cordonNode("a9"))
	n := startNodes(t, l, time.Minute)

	_, err := n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)

	start := time.Now()
	got, err := n.Get(ctx, "worker-1")
	require.NoError(t, err)
	assert.True(t, CordonedByIchor(got))
	assert.Less(t, time.Since(start), 10*time.Second, "no wait on a version that cannot be compared")
	assert.Equal(t, 1, l.gets())
}

func TestNodesGetNotInTheWatch(t *testing.T) {
	l := newLaggingNodes(t, cordonNode("9"))
	n := startNodes(t, l, time.Minute)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	_, err := n.Get(ctx, "worker-2")
	require.NoError(t, err, "the API server is asked (this fake answers any name)")
	assert.Equal(t, 1, l.gets())
}

// EnsureCordoned on a watch that is current: one patch, no read.
func TestNodesEnsureCordonedFromTheWatch(t *testing.T) {
	ctx := t.Context()
	l := newLaggingNodes(t, cordonNode("9"))
	n := startNodes(t, l, time.Minute)

	state, err := n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)
	assert.Equal(t, NotCordonedByIchor, state)
	assert.Equal(t, 0, l.gets())
	assert.Equal(t, 1, l.requests["patch"])
	assert.Equal(t, CordonedByUs, CordonOf(l.node))
}

// A watch that has not seen a change cannot make EnsureCordoned write on its old Node:
// the patch is refused, and it decides again on the API server's.
func TestNodesEnsureCordonedNeverWritesOnAnOldNode(t *testing.T) {
	ctx := t.Context()
	l := newLaggingNodes(t, cordonNode("9"))
	n := startNodes(t, l, time.Minute)

	// An earlier run's cordon, then kubectl uncordon (which keeps the mark): the watch
	// has seen neither.
	l.mu.Lock()
	l.node.Annotations = map[string]string{CordonedAnnotation: "2026-11-30T10:00:00Z"}
	l.node.ResourceVersion = "10"
	l.mu.Unlock()

	state, err := n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)
	assert.Equal(t, MarkedButSchedulable, state, "decided on the API server's Node")
	assert.Equal(t, 1, l.conflicts, "the write on the watch's Node was refused")
	assert.Equal(t, 1, l.gets())
	assert.Equal(t, CordonedByUs, CordonOf(l.node))
	assert.Equal(t, "2026-11-30T10:00:00Z", l.node.Annotations[CordonedAnnotation], "the mark's time is kept")
}

// When the watch says the node is cordoned by ichor, the API server is asked: a kubectl
// uncordon a moment ago counts.
func TestNodesEnsureCordonedConfirmsNothingToDo(t *testing.T) {
	ctx := t.Context()
	cordoned := cordonNode("9")
	cordoned.Spec.Unschedulable = true
	cordoned.Annotations = map[string]string{CordonedAnnotation: "2026-11-30T10:00:00Z"}
	l := newLaggingNodes(t, cordoned)
	n := startNodes(t, l, time.Minute)

	state, err := n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)
	assert.Equal(t, CordonedByUs, state)
	assert.Equal(t, 1, l.gets())
	assert.Equal(t, 0, l.requests["patch"])

	// kubectl uncordon; the watch has not seen it.
	l.mu.Lock()
	l.node.Spec.Unschedulable = false
	l.node.ResourceVersion = "10"
	l.mu.Unlock()

	state, err = n.EnsureCordoned(ctx, "worker-1", time.Now())
	require.NoError(t, err)
	assert.Equal(t, MarkedButSchedulable, state)
	assert.Equal(t, 2, l.gets())
	assert.Equal(t, 0, l.conflicts)
	assert.Equal(t, CordonedByUs, CordonOf(l.node))
}
