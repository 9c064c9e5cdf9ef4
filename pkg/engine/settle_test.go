package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// restartStaticPods makes a moved kubelet do what a real one does when its hash of
// the static pods changed: a moment after the Node says the new version, it deletes
// each mirror pod, restarts the pod, and after restart creates the mirror pod anew
// (a new UID), recorded as a start at the same version. never: the pods never come
// back.
func restartStaticPods(t *testing.T, f *fakeCluster, restart time.Duration, never bool) {
	f.kubeletMoved = func(m *fakeMachine, _ string) {
		if !strings.HasPrefix(m.name, "cp-") {
			return
		}

		pods := f.cs.CoreV1().Pods("kube-system")

		go func() {
			time.Sleep(50 * time.Millisecond)

			for _, c := range discovery.StaticPodComponents() {
				assert.NoError(t, pods.Delete(context.Background(), fmt.Sprintf("%s-%s", c, m.name), metav1.DeleteOptions{}))
			}

			if never {
				return
			}

			time.Sleep(restart)

			for _, c := range discovery.StaticPodComponents() {
				pod := mirrorPod(m.name, c, "v1.36.3")
				pod.UID = types.UID("restarted-" + pod.Name)

				_, err := pods.Create(context.Background(), pod, metav1.CreateOptions{})
				assert.NoError(t, err)
				f.record(m.name, string(c), "v1.36.3 restarted")
			}
		}()
	}
}

// A control plane's kubelet on the new version restarts its static pods a moment
// after its Node says so: the next control plane's kubelet moves only once they are
// back (on kind, moving on at once took the three apiservers down together). The
// restart seen, the engine does not wait out the settle window (a minute here; the
// run is bounded well below three).
func TestEngineKubeletRestartsStaticPods(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
	restartStaticPods(t, f, 1500*time.Millisecond, false)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	rec := &recorder{}
	e := f.engine("v1.36.3", func(o *Options) { o.StaticPodSettle = time.Minute })
	e.Progress = rec

	require.NoError(t, e.Run(ctx))

	f.mu.Lock()
	evs := slices.Clone(f.events)
	f.mu.Unlock()

	index := func(node, component, version string) int {
		i := slices.Index(evs, event{node: node, component: component, version: version})
		require.GreaterOrEqual(t, i, 0, "%s %s %s", node, component, version)

		return i
	}

	cps := []string{"cp-1", "cp-2", "cp-3"}
	for i, cp := range cps {
		restarted := index(cp, string(discovery.APIServer), "v1.36.3 restarted")
		next := "worker-1"

		if i+1 < len(cps) {
			next = cps[i+1]
		}

		assert.Less(t, restarted, index(next, string(discovery.Kubelet), "v1.36.3"),
			"%s's apiserver is back before %s's kubelet moves", cp, next)
	}

	assert.NotEmpty(t, rec.with("Kubelets cp-1 Verifying: kubelet restarted: waiting for", "no kube-apiserver mirror pod"), "the wait is said: %q", rec.with("Kubelets cp-1"))
}

// A kubelet on the new version that leaves its static pods alone (its hash did not
// change): the engine waits the settle window, the pods Ready all along, and goes on.
func TestEngineKubeletKeepsStaticPods(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})

	rec := &recorder{}
	e := f.engine("v1.36.3", func(o *Options) { o.StaticPodSettle = 500 * time.Millisecond })
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotEmpty(t, rec.with("Kubelets cp-2 Verifying: kubelet restarted: waiting for its static pods to stay Ready for 500ms"))
}

// Static pods that never come back after the kubelet's restart: the stage pauses on
// that control plane at the verify bound, cordoned, and goes no further.
func TestEngineKubeletStaticPodsNeverBack(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
	restartStaticPods(t, f, 0, true)

	err := f.engine("v1.36.3", func(o *Options) { o.VerifyTimeout = 2 * time.Second }).Run(context.Background())
	requirePause(t, err, "Kubelets", "cp-1", "static pods after the kubelet's restart",
		"no kube-apiserver mirror pod", "(the node stays cordoned)")
	assert.Equal(t, []string{"cp-1"}, f.cordonedByIchor())

	f.mu.Lock()
	defer f.mu.Unlock()

	assert.NotContains(t, f.events, event{node: "cp-2", component: string(discovery.Kubelet), version: "v1.36.3"}, "cp-2's kubelet never moves")
}
