package compat_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
)

// TestRules runs each rule over the 3+2 fixture the plan's checks are tested on: the
// cases of pkg/checks' version checks (their details and actions), then the edges the
// five wrappers disagreed on.
func TestRules(t *testing.T) {
	type rule func([]compat.Node, compat.Version) compat.Verdict

	var (
		step     rule = compat.KubernetesStep
		pairing  rule = compat.KubernetesSupported
		path     rule = compat.TalosUpgradeable
		onTarget rule = compat.TalosSupports
		allTalos      = func(c *discoverytest.Cluster, v string) {
			for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
				c.Node(n).Talos = v
			}
		}
	)

	tests := []struct {
		name    string
		rule    rule
		cluster func(c *discoverytest.Cluster)
		target  string
		allowed bool
		detail  []string
		action  string
		nodes   []string
	}{
		// one minor at a time, no downgrade (checks.VersionSkew)
		{name: "skew one minor", rule: step, target: "v1.36.3", allowed: true, detail: []string{"one minor (1.35 -> 1.36), no node behind"}},
		{name: "skew patch", rule: step, target: "v1.35.6", allowed: true, detail: []string{"patch upgrade within 1.35"}},
		{
			name: "skew skipped minor names the minor to go first", rule: step, target: "v1.36.3",
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-2").Kubernetes = "v1.34.7" },
			detail:  []string{"kubelet on worker-2", "upgrade to 1.35 first"}, nodes: []string{"worker-2"},
			action: "choose a target one minor at most above what every node runs, or hold the nodes behind",
		},
		{name: "skew downgrade", rule: step, target: "v1.35.1", detail: []string{"downgrades are not supported"}},
		{
			name: "skew ignores held nodes", rule: step, target: "v1.36.3", allowed: true,
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-2").Kubernetes = "v1.34.7"
				c.Node("worker-2").Hold = discoverytest.Ptr("old")
			},
		},
		{
			name: "skew judges the static pods a node runs", rule: step, target: "v1.36.3",
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-2").Versions = map[discovery.Component]string{discovery.Scheduler: "v1.34.1"}
			},
			detail: []string{"kube-scheduler", "on cp-2", "upgrade to 1.35 first"}, nodes: []string{"cp-2"},
		},
		{
			name: "skew: a -rc tag is not judged as its release", rule: step, target: "v1.36.3",
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-1").Versions = map[discovery.Component]string{discovery.APIServer: "v1.35.4-rc.0"}
			},
			detail: []string{`malformed version "v1.35.4-rc.0"`, "kube-apiserver, kube-apiserver pod on cp-1"},
		},
		{
			name: "skew: a digest after the tag keeps the tag's version", rule: step, target: "v1.36.3", allowed: true,
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-1").Versions = map[discovery.Component]string{
					discovery.APIServer: "v1.35.4@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
				}
			},
		},
		// Kubernetes supported by every node's Talos (checks.TalosPairing)
		{name: "pairing ok", rule: pairing, target: "v1.36.3", allowed: true, detail: []string{"Talos v1.13.9 supports Kubernetes 1.31-1.36"}},
		{
			name: "pairing target too new", rule: pairing, target: "v1.37.0",
			detail: []string{"Talos v1.13.9 (on cp-1, cp-2, cp-3, worker-1, worker-2) supports Kubernetes 1.31-1.36, not v1.37.0"},
			action: "upgrade Talos to 1.14 first: kubectl ichor upgrade talos --to v1.14.1",
			nodes:  []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"},
		},
		{
			name: "pairing 1.37 on Talos 1.14", rule: pairing, target: "v1.37.2", allowed: true,
			cluster: func(c *discoverytest.Cluster) { allTalos(c, "v1.14.1") },
			detail:  []string{"Talos v1.14.1 supports Kubernetes 1.32-1.37"},
		},
		{
			name: "pairing 1.37 with some nodes still on Talos 1.13", rule: pairing, target: "v1.37.2",
			cluster: func(c *discoverytest.Cluster) {
				allTalos(c, "v1.14.1")
				c.Node("worker-2").Talos = "v1.13.9"
			},
			detail: []string{"Talos v1.13.9 (on worker-2) supports Kubernetes 1.31-1.36, not v1.37.2"},
			action: "kubectl ichor upgrade talos --to v1.14.1", nodes: []string{"worker-2"},
		},
		{
			name: "pairing unknown Talos minor", rule: pairing, target: "v1.36.3",
			cluster: func(c *discoverytest.Cluster) { c.Node("cp-1").Talos = "v1.15.0" },
			detail:  []string{"Talos 1.15 (on cp-1) is newer than this build knows (Talos up to 1.14)"},
			action:  "upgrade kubectl-ichor", nodes: []string{"cp-1"},
		},
		{
			name: "pairing: every Talos version that does not support the target is named", rule: pairing, target: "v1.37.0",
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-1").Talos = "v1.12.5"
				c.Node("worker-1").Talos = "v1.14.1"
			},
			detail: []string{
				"Talos v1.12.5 (on cp-1) supports Kubernetes 1.30-1.35, not v1.37.0; " +
					"Talos v1.13.9 (on cp-2, cp-3, worker-2) supports Kubernetes 1.31-1.36, not v1.37.0",
			},
			action: "upgrade Talos to 1.14 first", nodes: []string{"cp-1", "cp-2", "cp-3", "worker-2"},
		},
		{
			name: "pairing: a target too old for the nodes' Talos does not suggest an older Talos", rule: pairing, target: "v1.31.4",
			cluster: func(c *discoverytest.Cluster) { allTalos(c, "v1.14.1") },
			detail:  []string{"Talos v1.14.1 (on cp-1, cp-2, cp-3, worker-1, worker-2) supports Kubernetes 1.32-1.37, not v1.31.4"},
			action:  "pick a --to in 1.32-1.37, which every node's Talos supports",
		},
		{
			name: "pairing: a pre-release Talos is refused, not judged as its release", rule: pairing, target: "v1.36.3",
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-1").Talos = "v1.13.0-beta.1" },
			detail:  []string{`Talos version on worker-1: malformed version "v1.13.0-beta.1"`},
			action:  "talosctl version", nodes: []string{"worker-1"},
		},
		{
			name: "pairing ignores held nodes", rule: pairing, target: "v1.37.2", allowed: true,
			cluster: func(c *discoverytest.Cluster) {
				allTalos(c, "v1.14.1")
				c.Node("worker-2").Talos = "v1.13.9"
				c.Node("worker-2").Hold = discoverytest.Ptr("RMA")
			},
		},
		{
			name: "pairing: a Talos older than machinery's tables", rule: pairing, target: "v1.24.0",
			cluster: func(c *discoverytest.Cluster) { c.Node("cp-1").Talos = "v1.1.2" },
			detail:  []string{"Talos 1.1 (on cp-1) is older than this build knows (Talos 1.2 to 1.14)"},
			action:  "upgrade Talos to 1.2 or newer with talosctl first",
		},
		// Talos target from each node's Talos (checks.UpgradePath)
		{name: "talos path", rule: path, target: "v1.14.1", allowed: true, detail: []string{"v1.13.9 -> v1.14.1 supported by machinery's upgrade table"}},
		{
			name: "talos path: every node there", rule: path, target: "v1.14.1", allowed: true,
			cluster: func(c *discoverytest.Cluster) { allTalos(c, "v1.14.1") }, detail: []string{"every node runs v1.14.1"},
		},
		{
			name: "talos path too old", rule: path, target: "v1.14.1",
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-1").Talos = "v1.11.3" },
			detail:  []string{"worker-1: host version 1.11.3 is too old to upgrade to Talos 1.14.1"},
			action:  "upgrade through an intermediate Talos release first", nodes: []string{"worker-1"},
		},
		{
			name: "talos downgrade", rule: path, target: "v1.13.2",
			detail: []string{"cp-1: v1.13.2 is older than the running v1.13.9: downgrades are not supported"},
			action: "choose a target at or above the Talos every node runs",
		},
		{
			name: "talos target unknown", rule: path, target: "v1.15.0",
			detail: []string{"Talos 1.15 is newer than this build knows (Talos up to 1.14)"}, action: "upgrade kubectl-ichor",
		},
		{
			name: "talos path: a pre-release node is refused", rule: path, target: "v1.14.1",
			cluster: func(c *discoverytest.Cluster) { c.Node("cp-3").Talos = "v1.14.0-alpha.2" },
			detail:  []string{`cp-3: Talos version: malformed version "v1.14.0-alpha.2"`}, nodes: []string{"cp-3"},
		},
		{
			name: "talos path ignores held nodes", rule: path, target: "v1.14.1", allowed: true,
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-1").Talos = "v1.11.3"
				c.Node("worker-1").Hold = discoverytest.Ptr("later")
			},
		},
		// Talos target supports the Kubernetes the cluster runs (checks.KubernetesSupported)
		{name: "kubernetes on target talos", rule: onTarget, target: "v1.13.9", allowed: true, detail: []string{"Talos v1.13.9 supports Kubernetes 1.31-1.36"}},
		{
			name: "kubernetes too old for target talos", rule: onTarget, target: "v1.13.9",
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-2").Kubernetes = "v1.30.4" },
			detail:  []string{"Kubernetes v1.30.4 (kubelet on worker-2) is outside 1.31-1.36"},
			action:  "move Kubernetes into that range first", nodes: []string{"worker-2"},
		},
		{
			name: "kubernetes too old for target talos on several nodes: said once, every node named", rule: onTarget, target: "v1.14.1",
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-1").Kubernetes, c.Node("worker-2").Kubernetes = "v1.31.2", "v1.31.2"
			},
			detail: []string{"Talos v1.14.1 supports Kubernetes 1.32-1.37: Kubernetes v1.31.2 (kubelet on worker-1) is outside 1.32-1.37"},
			nodes:  []string{"worker-1", "worker-2"},
		},
		{
			name: "kubernetes on target talos: a machine config image counts (Talos starts it after the reboot)", rule: onTarget, target: "v1.14.1",
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-2").Versions = map[discovery.Component]string{discovery.KubeProxy: "v1.31.2"}
			},
			detail: []string{"Kubernetes v1.31.2 (kube-proxy on cp-2) is outside 1.32-1.37"},
		},
		{
			name: "kubernetes on target talos: a held node's Kubernetes is not judged", rule: onTarget, target: "v1.14.1", allowed: true,
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-2").Kubernetes = "v1.31.2"
				c.Node("worker-2").Hold = discoverytest.Ptr("stays")
			},
		},
		{
			name: "kubernetes on target talos: a version that cannot be read refuses", rule: onTarget, target: "v1.14.1",
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-1").Versions = map[discovery.Component]string{discovery.Scheduler: "v1.35.4-custom"}
			},
			detail: []string{`cp-1 kube-scheduler: malformed version "v1.35.4-custom"`},
		},
		{
			name: "kubernetes on target talos unknown", rule: onTarget, target: "v1.15.0",
			detail: []string{"Talos 1.15 is newer than this build knows"}, action: "upgrade kubectl-ichor",
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := discoverytest.ThreePlusTwo()
			if tt.cluster != nil {
				tt.cluster(c)
			}

			got := tt.rule(compat.FromSnapshot(c.Snapshot(t)), compat.MustParseVersion(tt.target))

			assert.Equal(t, tt.allowed, got.Allowed, "detail: %s", got.Detail)
			assert.NotContains(t, got.Detail, "\n")
			assert.NotEmpty(t, got.Detail)

			for _, d := range tt.detail {
				assert.Contains(t, got.Detail, d)
			}

			assert.Contains(t, got.Action, tt.action)

			if tt.nodes != nil {
				assert.Equal(t, tt.nodes, got.Nodes)
			}

			if tt.allowed {
				assert.NoError(t, got.Err())
				assert.Equal(t, api.ResultOK, got.Check("x").Result)

				return
			}

			assert.NotEmpty(t, got.Action)

			var refusal *compat.Refusal
			require.ErrorAs(t, got.Err(), &refusal)
			assert.Equal(t, got.Detail, refusal.Reason)
			assert.Equal(t, api.Check{Name: "x", Result: api.ResultRefused, Detail: got.Detail, Action: got.Action}, got.Check("x"))
		})
	}
}
