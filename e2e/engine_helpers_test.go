//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// countingTalos is the product's Talos client, counting the applies that
// went through (a resumed engine must not apply a node's config twice).
type countingTalos struct {
	*talos.Client

	mu      sync.Mutex
	applied []string // "ip sha256" of every real apply that succeeded
}

func (c *countingTalos) Apply(ctx context.Context, node string, cfg []byte, dryRun bool) (talos.ApplyResult, error) {
	res, err := c.Client.Apply(ctx, node, cfg, dryRun)
	if err == nil && !dryRun {
		c.mu.Lock()
		c.applied = append(c.applied, fmt.Sprintf("%s %x", node, sha256.Sum256(cfg)))
		c.mu.Unlock()
	}

	return res, err
}

func (c *countingTalos) applies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()

	return slices.Clone(c.applied)
}

// lines is a Progress that keeps every line and can call a hook on each.
type lines struct {
	mu     sync.Mutex
	all    []string
	onLine func(line string)
}

func (l *lines) Stage(index, total int, name string) {
	l.add(fmt.Sprintf("stage %d/%d %s", index, total, name))
}

func (l *lines) Node(stage, node string, phase engine.NodePhase, message string) {
	l.add(fmt.Sprintf("%s %s %s: %s", stage, node, phase, message))
}

func (l *lines) Step(stage, step, message string) {
	l.add(fmt.Sprintf("%s [%s] %s", stage, step, message))
}

func (l *lines) add(line string) {
	l.mu.Lock()
	l.all = append(l.all, line)
	hook := l.onLine
	l.mu.Unlock()

	if hook != nil {
		hook(line)
	}
}

// engine returns an Engine for c driving it to target through the admin
// kubeconfig and talosconfig, with bounds fit for the simulator.
func engineFor(t *testing.T, c *Cluster, tc *countingTalos, target string, progress *lines) *engine.Engine {
	t.Helper()

	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	require.NoError(t, err)

	cfg.QPS, cfg.Burst = 100, 200

	return &engine.Engine{
		Kube:    c.Client,
		Dynamic: dynamic.NewForConfigOrDie(cfg),
		Talos:   tc,
		Options: engine.Options{
			Kind: engine.KindKubernetes, Target: target, MaxUnavailable: 1,
			ApplyTimeout: 2 * time.Minute, VerifyTimeout: 2 * time.Minute, DrainTimeout: 2 * time.Minute, PullTimeout: time.Minute,
		},
		Progress: progress,
		Out:      testWriter{t},
	}
}

// testWriter sends the engine's lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))

	return len(p), nil
}

func openTalos(t *testing.T, c *Cluster) *countingTalos {
	t.Helper()

	tc, err := talos.Open(context.Background(), talos.Options{ConfigPath: c.Talosconfig})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })

	return &countingTalos{Client: tc}
}

// machineConfigs reads every node's active config through Talos.
func machineConfigs(t *testing.T, c *Cluster, tc *countingTalos) map[string]config.Provider {
	t.Helper()

	out := map[string]config.Provider{}

	for _, m := range c.Info.Machines {
		cfg, err := tc.MachineConfig(context.Background(), m.IP)
		require.NoError(t, err, m.Name)

		out[m.Name] = cfg
	}

	return out
}

// addWorkload runs a Deployment of replicas pods on the workers behind a
// PodDisruptionBudget that allows one disruption, for the drains to evict.
func addWorkload(t *testing.T, c *Cluster, replicas int32) {
	t.Helper()

	ctx := context.Background()
	labels := map[string]string{"app": "web"}

	_, err := c.Client.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}},
			},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	maxUnavailable := intstr.FromInt32(1)
	_, err = c.Client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &maxUnavailable, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	eventually(t, time.Minute, "web pods Ready", func(ctx context.Context) error {
		d, err := c.Client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}

		if d.Status.ReadyReplicas != replicas {
			return fmt.Errorf("%d of %d Ready", d.Status.ReadyReplicas, replicas)
		}

		return nil
	})
}

// requireUpgraded checks the cluster after an upgrade to target: every Node
// Ready on the target kubelet and schedulable, no ichor cordon mark left,
// every control plane's static pods Ready on the target, kube-proxy rolled
// out, and each node's config its old one but for the five image tags, now
// on the target.
func requireUpgraded(t *testing.T, c *Cluster, tc *countingTalos, before map[string]config.Provider, target string) {
	t.Helper()

	ctx := context.Background()

	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, nodes.Items, len(c.Info.Machines))

	for _, n := range nodes.Items {
		assert.True(t, nodeReady(&n), "%s Ready", n.Name)
		assert.False(t, n.Spec.Unschedulable, "%s schedulable", n.Name)
		assert.False(t, kube.CordonedByIchor(&n), "%s has no cordon mark", n.Name)
		assert.Equal(t, target, n.Status.NodeInfo.KubeletVersion, n.Name)
	}

	pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "tier=control-plane"})
	require.NoError(t, err)

	for _, p := range pods.Items {
		assert.Equal(t, target, render.TagOf(p.Spec.Containers[0].Image), p.Name)
		assert.True(t, isReady(&p), "%s Ready", p.Name)
	}

	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, target, render.TagOf(ds.Spec.Template.Spec.Containers[0].Image))
	assert.Equal(t, ds.Status.DesiredNumberScheduled, ds.Status.NumberAvailable)

	after := machineConfigs(t, c, tc)

	for name, old := range before {
		require.NoError(t, render.Verify(old, after[name]), "%s: only the image tags changed", name)

		for comp, image := range render.Images(after[name]) {
			assert.Equal(t, target, render.TagOf(image), "%s %s", name, comp)
			assert.Equal(t, render.RepositoryOf(render.Images(old)[comp]), render.RepositoryOf(image), "%s %s keeps its repository", name, comp)
		}
	}
}

// requireEventOrder checks the simulator's record of what ran: the
// invariant never broken at any event, and the target reached in the
// staged order: apiservers cp-1 cp-2 cp-3, then controller-managers and
// schedulers cp-1 cp-2 cp-3, then kube-proxy everywhere, then the kubelets
// in the given order.
func requireEventOrder(t *testing.T, evs []events.Event, target string, cps, kubelets []string) {
	t.Helper()

	require.Empty(t, invariantBreaks(evs), "the invariant held at every event")

	first := firstAt(evs, target)

	at := func(component, node string) int {
		i, ok := first[component+" "+node]
		require.True(t, ok, "%s never started at %s on %s", component, target, node)

		return i
	}

	var (
		apiservers, components, proxies, kubeletStarts []int
	)

	for _, n := range cps {
		apiservers = append(apiservers, at(events.APIServer, n))
		components = append(components, max(at(events.ControllerManager, n), at(events.Scheduler, n)))
	}

	for _, n := range kubelets {
		proxies = append(proxies, at(events.KubeProxy, n))
		kubeletStarts = append(kubeletStarts, at(events.Kubelet, n))
	}

	minOf := func(s []int) int { return slices.Min(s) }
	maxOf := func(s []int) int { return slices.Max(s) }

	assert.True(t, slices.IsSorted(apiservers), "apiservers in order %v: %v", cps, apiservers)
	assert.True(t, slices.IsSorted(components), "controller-managers and schedulers in order %v: %v", cps, components)
	assert.True(t, slices.IsSorted(kubeletStarts), "kubelets in order %v: %v", kubelets, kubeletStarts)

	for _, n := range cps {
		// Each control plane's controller-manager and scheduler move in one step.
		cm, sched := at(events.ControllerManager, n), at(events.Scheduler, n)
		assert.Less(t, maxOf(apiservers), min(cm, sched), "%s: every apiserver before its controller-manager and scheduler", n)
	}

	assert.Less(t, maxOf(components), minOf(proxies), "every controller-manager and scheduler before any kube-proxy")
	assert.Less(t, maxOf(proxies), minOf(kubeletStarts), "every kube-proxy before any kubelet")
}

// invariantBreaks replays the events and returns each point at which a
// controller-manager, scheduler, kube-proxy or kubelet ran newer than some
// apiserver. A version is compared in full (a patch counts).
func invariantBreaks(evs []events.Event) []string {
	state := map[string]events.Event{}

	var broken []string

	for i, e := range evs {
		if e.Component == events.Talos || e.Component == events.TalosInstall || e.Component == events.Cordon || e.Component == events.PodStopped || e.Component == events.PodCut {
			continue
		}

		state[e.Node+"/"+e.Component] = e

		var oldest *stages.Version

		for _, s := range state {
			if s.Component != events.APIServer {
				continue
			}

			if v, err := stages.ParseVersion(s.Version); err == nil && (oldest == nil || v.Compare(*oldest) < 0) {
				oldest = &v
			}
		}

		if oldest == nil {
			continue
		}

		for _, s := range state {
			if s.Component == events.APIServer {
				continue
			}

			if v, err := stages.ParseVersion(s.Version); err == nil && v.Compare(*oldest) > 0 {
				broken = append(broken, fmt.Sprintf("event %d (%s %s %s): %s %s on %s newer than apiserver %s",
					i, e.Node, e.Component, e.Version, s.Component, s.Version, s.Node, oldest))
			}
		}
	}

	return broken
}
