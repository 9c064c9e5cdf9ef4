//go:build e2e

package e2e

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// The versions of the Talos 1.14 tests: Kubernetes 1.37 needs Talos 1.14.
const (
	talos114 = "v1.14.1"
	talos113 = "v1.13.9"
	kube136  = "v1.36.3"
	kube137  = "v1.37.2"
)

// TestTalos114Kubernetes137 upgrades Kubernetes v1.36.3 -> v1.37.2 through the
// Job on 3+2 Talos v1.14.1 clusters: one whose configs are all Talos 1.14
// documents, and one grown across the 1.14 upgrade (nodes in the v1alpha1
// layout, nodes in documents, and a node with some components in each).
// Every image is changed where its node keeps it: the final configs differ
// from the originals only in image tags, in the same layout.
func TestTalos114Kubernetes137(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		layout string
		want   map[string]string // node -> plan's configLayout
	}{
		{
			layout: "multi-doc",
			want:   map[string]string{"cp-1": api.LayoutMultiDoc, "cp-2": api.LayoutMultiDoc, "cp-3": api.LayoutMultiDoc, "worker-1": api.LayoutMultiDoc, "worker-2": api.LayoutMultiDoc},
		},
		{
			// Machine i keeps v1alpha1 when i%3 == 0, documents when 1, both when 2;
			// a worker carries only the kubelet, so its layout is whole.
			layout: "mixed",
			want:   map[string]string{"cp-1": api.LayoutV1Alpha1, "cp-2": api.LayoutMultiDoc, "cp-3": api.LayoutMixed, "worker-1": api.LayoutV1Alpha1, "worker-2": api.LayoutMultiDoc},
		},
	} {
		t.Run(tc.layout, func(t *testing.T) {
			t.Parallel()

			c := startJobCluster(t, "--kubernetes", kube136, "--talos", talos114, "--config-layout", tc.layout)
			addWorkload(t, c, 2)

			talos := openTalos(t, c)
			before := machineConfigs(t, c, talos)

			r := c.plugin(t, "plan", "kubernetes", "--to", kube137, "-o", "json")
			r.requireExit(t, 0)
			plan := decodePlan(t, r.stdout)
			require.True(t, plan.Runnable)
			requirePlanLayouts(t, plan, tc.want, before)

			start := time.Now()
			r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", kube137, "--yes")
			r.requireExit(t, 0)
			t.Logf("upgraded 3+2 (%s) from %s to %s through the Job in %s", tc.layout, kube136, kube137, time.Since(start).Round(time.Millisecond))

			requireUpgraded(t, c, talos, before, kube137)
			requireLayoutsKept(t, before, machineConfigs(t, c, talos))
			requireNothingCordoned(t, c)
			requireStagedOrder(t, c.Events(t), kube137)
		})
	}
}

// TestTalos113To114ThenKubernetes137 is the path of a cluster on Talos 1.13
// that wants Kubernetes 1.37: refused with what to do, the Talos OS upgraded to
// 1.14 through the Job (every config kept as it was, as Talos does), then the
// same plan runnable and the Kubernetes upgrade done on the configs' v1alpha1
// layout.
func TestTalos113To114ThenKubernetes137(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--kubernetes", kube136, "--talos", talos113)
	addWorkload(t, c, 2)

	talos := openTalos(t, c)
	before := machineConfigs(t, c, talos)

	// 1.37 on Talos 1.13: refused, naming the nodes and the Talos to go to.
	r := c.plugin(t, "plan", "kubernetes", "--to", kube137, "-o", "json")
	r.requireExit(t, 2)
	refused := decodePlan(t, r.stdout)
	require.False(t, refused.Runnable)

	pairing := planCheck(t, refused, "talos pairing")
	assert.Equal(t, api.ResultRefused, pairing.Result)
	assert.Contains(t, pairing.Detail, "Talos v1.13.9 (on cp-1, cp-2, cp-3, worker-1, worker-2) supports Kubernetes 1.31-1.36, not v1.37.2")
	assert.Contains(t, pairing.Action, "kubectl ichor upgrade talos --to v1.14.1")
	assert.Contains(t, r.stderr, "talos pairing")

	// The Talos OS, 1.13 -> 1.14, through the Job.
	start := time.Now()
	r = c.ichor(t, 10*time.Minute, "upgrade", "talos", "--to", talos114, "--yes")
	r.requireExit(t, 0)
	t.Logf("upgraded Talos 3+2 from %s to %s through the Job in %s", talos113, talos114, time.Since(start).Round(time.Millisecond))
	// The status's summary times each node from its Upgrade call to done: it
	// was upgraded, not only verified.
	r = c.ichor(t, time.Minute, "status")
	r.requireExit(t, 0)
	assert.Regexp(t, `(?m)^\s+worker-1\s+TalosOS \d+s\b`, r.stdout)
	assert.NotContains(t, r.stdout, "TalosOS verified")

	requireTalosAt(t, c, talos, talos114)

	upgraded := machineConfigs(t, c, talos)
	for name, cfg := range before {
		requireSameConfig(t, cfg, upgraded[name], name+": a Talos upgrade keeps the config")
	}

	// Now 1.37 is runnable, on the v1alpha1 layout the configs kept.
	r = c.plugin(t, "plan", "kubernetes", "--to", kube137, "-o", "json")
	r.requireExit(t, 0)
	plan := decodePlan(t, r.stdout)
	require.True(t, plan.Runnable)
	assert.Equal(t, api.ResultOK, planCheck(t, plan, "talos pairing").Result)
	requirePlanLayouts(t, plan, map[string]string{
		"cp-1": api.LayoutV1Alpha1, "cp-2": api.LayoutV1Alpha1, "cp-3": api.LayoutV1Alpha1, "worker-1": api.LayoutV1Alpha1, "worker-2": api.LayoutV1Alpha1,
	}, upgraded)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", kube137, "--yes")
	r.requireExit(t, 0)

	requireUpgraded(t, c, talos, upgraded, kube137)
	requireLayoutsKept(t, upgraded, machineConfigs(t, c, talos))
	requireStagedOrder(t, c.Events(t), kube137)
}

// TestTalos112To114 upgrades the Talos OS two minors at once, v1.12.4 ->
// v1.14.1, which machinery's upgrade table allows, on a 1+1 cluster driven by
// the engine: each node reboots once into 1.14 and keeps its config.
func TestTalos112To114(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "1", "--workers", "1", "--kubernetes", "v1.35.4", "--talos", "v1.12.4")

	talos := openTalos(t, c)
	before := machineConfigs(t, c, talos)

	r := c.plugin(t, "plan", "talos", "--to", talos114, "--allow-etcd-outage", "-o", "json")
	r.requireExit(t, 0)
	plan := decodePlan(t, r.stdout)
	assert.Equal(t, api.ResultOK, planCheck(t, plan, "upgrade path").Result)
	assert.Equal(t, api.ResultWarn, planCheck(t, plan, "etcd quorum").Result, "one etcd member: the outage accepted")

	require.NoError(t, talosEngineFor(t, c, talos, talos114, &memoMap{m: map[string]string{}}, &lines{}).Run(context.Background()))

	requireTalosAt(t, c, talos, talos114)

	var boots []string
	for _, e := range c.Events(t) {
		if e.Component == events.Talos && e.Version == talos114 {
			boots = append(boots, e.Node)
		}
	}

	assert.Equal(t, []string{"cp-1", "worker-1"}, boots, "one boot into 1.14 per node, the control plane first")

	after := machineConfigs(t, c, talos)
	for name, cfg := range before {
		requireSameConfig(t, cfg, after[name], name+": a Talos upgrade keeps the config")
	}
}

// requirePlanLayouts checks the plan's configLayout of every node in every
// stage, and that each change names the path its node keeps the image at.
func requirePlanLayouts(t *testing.T, plan api.Plan, want map[string]string, configs map[string]config.Provider) {
	t.Helper()

	seen := map[string]string{}

	for _, s := range plan.Stages {
		for _, n := range s.Nodes {
			seen[n.Node] = n.ConfigLayout

			for _, ch := range n.Changes {
				c := render.Component(ch.Component)
				assert.Equal(t, c.PathIn(render.LayoutOf(configs[n.Node], c)), ch.Path, "%s %s %s", s.Name, n.Node, c)
			}
		}
	}

	assert.Equal(t, want, seen)
}

// requireLayoutsKept checks that no component moved between layouts.
func requireLayoutsKept(t *testing.T, before, after map[string]config.Provider) {
	t.Helper()

	for _, name := range slices.Sorted(maps.Keys(before)) {
		assert.Equal(t, render.Layouts(before[name]), render.Layouts(after[name]), "%s: every image where it was", name)
	}
}

// requireSameConfig checks that two configs are the same, documents and fields.
func requireSameConfig(t *testing.T, want, got config.Provider, msg string) {
	t.Helper()

	wantHash, err := render.Hash(want)
	require.NoError(t, err)

	gotHash, err := render.Hash(got)
	require.NoError(t, err)

	if wantHash != gotHash {
		diff, _ := render.Diff(want, got)
		t.Errorf("%s; it changed:\n%s", msg, diff)
	}
}

// requireStagedOrder checks events.jsonl: the invariant held at every event,
// and the stages in order, whichever node ran the Job: every apiserver at
// the target before any controller-manager or scheduler, the control planes
// in the same order in both stages, every kubelet last.
func requireStagedOrder(t *testing.T, evs []events.Event, target string) {
	t.Helper()

	require.Empty(t, invariantBreaks(evs), "the invariant held at every event")

	var cps []string

	for _, e := range evs {
		if e.Component == events.APIServer && e.Version == target && !slices.Contains(cps, e.Node) {
			cps = append(cps, e.Node)
		}
	}

	require.Len(t, cps, 3, "every apiserver reached %s", target)

	order := kubeletOrder(evs, target)
	require.Len(t, order, 5, "every kubelet reached %s", target)
	assert.ElementsMatch(t, cps, order[:3], "the control planes' kubelets first")

	requireEventOrder(t, evs, target, cps, order)
}

// planCheck returns the plan's check of that name.
func planCheck(t *testing.T, plan api.Plan, name string) api.Check {
	t.Helper()

	for _, c := range plan.Checks {
		if c.Name == name {
			return c
		}
	}

	names := make([]string, 0, len(plan.Checks))
	for _, c := range plan.Checks {
		names = append(names, c.Name)
	}

	t.Fatalf("no check %q in the plan (checks: %s)", name, strings.Join(names, ", "))

	return api.Check{}
}
