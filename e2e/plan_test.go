//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// The version the plan tests' clusters start at, and the upgrade they plan.
const (
	planFrom   = "v1.35.4"
	planTo     = "v1.36.3"
	planTalos  = "v1.13.9"
	planOldTal = "v1.12.4"
)

// TestPlan drives `kubectl ichor plan kubernetes` as a user would, against one
// 3+2 cluster at v1.35.4 on Talos v1.13.9. The subtests that change the
// cluster (private registry, a node left behind) come last and stay changed;
// the others leave it as they found it.
func TestPlan(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", planFrom, "--talos", planTalos)
	ctx := context.Background()
	cps := []string{"cp-1", "cp-2", "cp-3"}
	all := []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}

	t.Run("to v1.36.3 runs", func(t *testing.T) {
		r := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		r.requireExit(t, 0)
		require.Empty(t, r.stderr)

		out := r.stdout
		require.Contains(t, out, `Cluster "ichor-sim" at `+c.Info.APIServer+` (3 control planes, 2 workers; Talos v1.13.9 x5)`)
		for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			require.Regexp(t, `(?m)^`+comp+`\s+v1\.35\.4 x3\s+v1\.36\.3$`, out)
		}
		require.Regexp(t, `(?m)^kube-proxy\s+v1\.35\.4 x5\s+v1\.36\.3$`, out)
		require.Regexp(t, `(?m)^kubelet\s+v1\.35\.4 x5\s+v1\.36\.3$`, out)

		// The four stages in order, each with its nodes in order.
		stages := tableStages(out)
		require.Equal(t, []string{"APIServers", "ControlPlaneComponents", "KubeProxy", "Kubelets"}, stageNames(stages))
		require.Equal(t, cps, stages[0].nodes)
		require.Equal(t, cps, stages[1].nodes)
		require.Equal(t, cps, stages[2].nodes)
		require.Equal(t, all, stages[3].nodes)
		require.Contains(t, lineWith(out, "cp-1"), "kube-apiserver v1.35.4 -> v1.36.3")
		require.Contains(t, out, "then: bootstrap manifests, kube-proxy rollout")
		require.Contains(t, out, "Images, repositories kept: registry.k8s.io/* (cp-1, cp-2, cp-3), ghcr.io/siderolabs/* (5 nodes)")

		checks := tableChecks(out)
		for _, name := range []string{"version skew", "invariant", "talos pairing", "nodes ready", "talos nodes", "endpoint", "held nodes", "talos access for job"} {
			require.Equal(t, api.ResultOK, checks[name].result, "check %q: %s", name, checks[name].detail)
		}
		require.Contains(t, checks["version skew"].detail, "one minor (1.35 -> 1.36), no node behind")
		require.Contains(t, checks["talos pairing"].detail, "Talos v1.13.9 supports Kubernetes 1.31-1.36")
		require.Equal(t, "5/5", checks["nodes ready"].detail)
		for name, ch := range checks {
			require.NotEqual(t, api.ResultRefused, ch.result, "check %q: %s", name, ch.detail)
		}
	})

	t.Run("-o json and -o yaml print the Plan document", func(t *testing.T) {
		r := c.plugin(t, "plan", "kubernetes", "--to", planTo, "--max-unavailable", "2", "-o", "json")
		r.requireExit(t, 0)
		plan := decodePlan(t, r.stdout)

		require.Equal(t, api.APIVersion, plan.APIVersion)
		require.Equal(t, api.KindPlan, plan.Kind)
		require.Equal(t, api.UpgradeKubernetes, plan.Upgrade)
		require.Equal(t, planTo, plan.Target)
		require.Equal(t, 2, plan.MaxUnavailable)
		require.True(t, plan.Runnable)
		require.Equal(t, api.Cluster{
			Name: "ichor-sim", Endpoint: c.Info.APIServer, ControlPlanes: 3, Workers: 2,
			Talos: []api.VersionCount{{Version: planTalos, Count: 5}},
		}, plan.Cluster)
		require.Empty(t, plan.Held)
		require.Empty(t, plan.AtTarget)

		components := map[string][]api.VersionCount{}
		for _, comp := range plan.Components {
			require.Equal(t, planTo, comp.Target, comp.Name)
			components[comp.Name] = comp.Current
		}
		require.Equal(t, map[string][]api.VersionCount{
			"kube-apiserver":          {{Version: planFrom, Count: 3}},
			"kube-controller-manager": {{Version: planFrom, Count: 3}},
			"kube-scheduler":          {{Version: planFrom, Count: 3}},
			"kube-proxy":              {{Version: planFrom, Count: 5}},
			"kubelet":                 {{Version: planFrom, Count: 5}},
		}, components)

		want := map[string]map[string][]string{ // stage -> node -> components changed
			"APIServers":             {"cp-1": {"kube-apiserver"}, "cp-2": {"kube-apiserver"}, "cp-3": {"kube-apiserver"}},
			"ControlPlaneComponents": {"cp-1": {"kube-controller-manager", "kube-scheduler"}, "cp-2": {"kube-controller-manager", "kube-scheduler"}, "cp-3": {"kube-controller-manager", "kube-scheduler"}},
			"KubeProxy":              {"cp-1": {"kube-proxy"}, "cp-2": {"kube-proxy"}, "cp-3": {"kube-proxy"}},
			"Kubelets":               {"cp-1": {"kubelet"}, "cp-2": {"kubelet"}, "cp-3": {"kubelet"}, "worker-1": {"kubelet"}, "worker-2": {"kubelet"}},
		}
		require.Len(t, plan.Stages, 4)
		for _, s := range plan.Stages {
			require.False(t, s.Skipped, s.Name)
			for _, n := range s.Nodes {
				var got []string
				for _, ch := range n.Changes {
					got = append(got, ch.Component)
					repo := "registry.k8s.io/" + ch.Component
					if ch.Component == "kubelet" {
						repo = "ghcr.io/siderolabs/kubelet"
					}
					require.Equal(t, repo+":"+planFrom, ch.From, "%s %s", s.Name, n.Node)
					require.Equal(t, repo+":"+planTo, ch.To, "%s %s", s.Name, n.Node)
				}
				require.Equal(t, want[s.Name][n.Node], got, "%s %s", s.Name, n.Node)
			}
		}
		// Control planes one at a time, then the two workers together.
		require.Equal(t, []string{"cp-1/1", "cp-2/2", "cp-3/3", "worker-1/4", "worker-2/4"}, stepBatches(plan.Stages[3]))

		byName := map[string]api.Check{}
		for _, ch := range plan.Checks {
			byName[ch.Name] = ch
			require.NotEqual(t, api.ResultRefused, ch.Result, "%s: %s", ch.Name, ch.Detail)
		}
		require.Equal(t, api.ResultOK, byName["version skew"].Result)
		require.Equal(t, api.ResultOK, byName["talos pairing"].Result)

		// The document holds what the table shows.
		table := c.plugin(t, "plan", "kubernetes", "--to", planTo, "--max-unavailable", "2")
		table.requireExit(t, 0)
		stages := tableStages(table.stdout)
		require.Equal(t, len(plan.Stages), len(stages))
		for i, s := range plan.Stages {
			require.Equal(t, s.Name, stages[i].name)
			require.Equal(t, stepNodes(s), stages[i].nodes, s.Name)
		}
		tchecks := tableChecks(table.stdout)
		require.Len(t, tchecks, len(plan.Checks))
		for _, ch := range plan.Checks {
			require.Equal(t, ch.Result, tchecks[ch.Name].result, ch.Name)
			require.True(t, strings.HasPrefix(tchecks[ch.Name].detail, ch.Detail), "%s: table %q, json %q", ch.Name, tchecks[ch.Name].detail, ch.Detail)
		}

		// -o yaml is the same document.
		y := c.plugin(t, "plan", "kubernetes", "--to", planTo, "--max-unavailable", "2", "-o", "yaml")
		y.requireExit(t, 0)
		require.True(t, strings.HasPrefix(y.stdout, "apiVersion: ichor.dev/v1alpha1\n"), y.stdout)
		var fromYAML api.Plan
		require.NoError(t, yaml.UnmarshalStrict([]byte(y.stdout), &fromYAML))
		require.Equal(t, plan, fromYAML)
	})

	t.Run("to v1.37.0 is refused", func(t *testing.T) {
		r := c.plugin(t, "plan", "kubernetes", "--to", "v1.37.0")
		r.requireExit(t, 2)
		r.requireOneLineError(t, "plan refused by version skew, talos pairing")
		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultRefused, checks["version skew"].result)
		require.Contains(t, checks["version skew"].detail, "v1.37.0 skips a minor from v1.35.4: upgrade to 1.36 first")
		require.Equal(t, api.ResultRefused, checks["talos pairing"].result)
		require.Contains(t, checks["talos pairing"].detail, "Talos v1.13.9")
		require.Contains(t, checks["talos pairing"].detail, "supports Kubernetes 1.31-1.36, not v1.37.0")
		require.Contains(t, checks["talos pairing"].detail, "upgrade Talos to 1.14 first: kubectl ichor upgrade talos --to v1.14.1")

		j := c.plugin(t, "plan", "kubernetes", "--to", "v1.37.0", "-o", "json")
		j.requireExit(t, 2)
		plan := decodePlan(t, j.stdout)
		require.False(t, plan.Runnable)
	})

	t.Run("a downgrade is refused", func(t *testing.T) {
		r := c.plugin(t, "plan", "kubernetes", "--to", "v1.34.2")
		r.requireExit(t, 2)
		r.requireOneLineError(t, "plan refused by version skew")
		require.Contains(t, tableChecks(r.stdout)["version skew"].detail, "v1.34.2 is older than the running v1.35.4: downgrades are not supported")
	})

	t.Run("bad input is one line and exit 1", func(t *testing.T) {
		home := t.TempDir()
		noTalos := []string{"HOME=" + home, "TALOSCONFIG="}
		missing := filepath.Join(t.TempDir(), "no-such-talosconfig")
		for _, tc := range []struct {
			name string
			env  []string
			args []string
			want string
		}{
			{"malformed version", nil, []string{"--to", "1.36"},
				`--to: malformed version "1.36": write it as vMAJOR.MINOR.PATCH, e.g. v1.36.3`},
			{"version without patch", nil, []string{"--to", "v1.36"}, `malformed version "v1.36"`},
			{"no --to", nil, nil, "--to is required"},
			{"bad output", nil, []string{"--to", planTo, "-o", "xml"}, `-o "xml": pass -o json or -o yaml`},
			{"missing --talosconfig", nil, []string{"--to", planTo, "--talosconfig", missing},
				"talosconfig " + missing + ": not found: check the --talosconfig path"},
			{"no talosconfig anywhere", noTalos, []string{"--to", planTo, "--talosconfig", ""},
				"no talosconfig found (looked at " + filepath.Join(home, ".talos", "config") + ": not found"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.name == "no talosconfig anywhere" {
					if _, err := os.Stat("/var/run/secrets/talos.dev/config"); err == nil {
						t.Skip("this machine has /var/run/secrets/talos.dev/config, the last place looked at")
					}
				}
				r := c.pluginEnv(t, tc.env, append([]string{"plan", "kubernetes"}, tc.args...)...)
				r.requireExit(t, 1)
				require.Empty(t, r.stdout)
				r.requireOneLineError(t, tc.want)
			})
		}

		t.Run("kubernetes unreachable", func(t *testing.T) {
			kubeconfig := c.kubeconfigWithServer(t, "https://127.0.0.1:1")
			r := runPlugin(t, nil, "plan", "kubernetes", "--to", planTo, "--kubeconfig", kubeconfig, "--talosconfig", c.Talosconfig)
			r.requireExit(t, 1)
			require.Empty(t, r.stdout)
			r.requireOneLineError(t, "kubernetes API at https://127.0.0.1:1 unreachable")
			require.Contains(t, r.stderr, "check --kubeconfig and --context")
		})

		t.Run("talos unreachable", func(t *testing.T) {
			r := c.plugin(t, "plan", "kubernetes", "--to", planTo, "--talos-endpoints", "127.0.0.1:1")
			r.requireExit(t, 1)
			require.Empty(t, r.stdout)
			r.requireOneLineError(t, "talos API at ")
			require.Contains(t, r.stderr, "unreachable")
			require.Contains(t, r.stderr, "check --talos-endpoints and --talosconfig")
		})

		t.Run("RBAC denied", func(t *testing.T) {
			kubeconfig := c.serviceAccountKubeconfig(t, "default", "ichor-e2e-nobody")
			r := runPlugin(t, nil, "plan", "kubernetes", "--to", planTo, "--kubeconfig", kubeconfig, "--talosconfig", c.Talosconfig)
			r.requireExit(t, 1)
			require.Empty(t, r.stdout)
			r.requireOneLineError(t, `kubernetes RBAC denied "list" on "nodes" at cluster scope`)
			require.Contains(t, r.stderr, "kubectl auth can-i list nodes -A")
		})
	})

	t.Run("a held node is shown as held and excluded", func(t *testing.T) {
		out, err := c.kubectl(t, "annotate", "node", "worker-2", "ichor.dev/hold=waiting for a firmware fix")
		require.NoError(t, err, out)
		t.Cleanup(func() {
			if out, err := c.kubectl(t, "annotate", "node", "worker-2", "ichor.dev/hold-"); err != nil {
				t.Errorf("remove the hold: %v: %s", err, out)
			}
		})

		r := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		r.requireExit(t, 0)
		stages := tableStages(r.stdout)
		require.Equal(t, []string{"cp-1", "cp-2", "cp-3", "worker-1"}, stages[3].nodes)
		require.Contains(t, r.stdout, "Held: worker-2 (ichor.dev/hold: waiting for a firmware fix)")
		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultWarn, checks["held nodes"].result)
		require.Contains(t, checks["held nodes"].detail, "worker-2 held (ichor.dev/hold): not upgraded")
		require.Equal(t, "4/4", checks["nodes ready"].detail)

		j := c.plugin(t, "plan", "kubernetes", "--to", planTo, "-o", "json")
		j.requireExit(t, 0)
		plan := decodePlan(t, j.stdout)
		require.Equal(t, []api.NodeNote{{Node: "worker-2", Reason: "ichor.dev/hold: waiting for a firmware fix"}}, plan.Held)
		for _, s := range plan.Stages {
			require.NotContains(t, stepNodes(s), "worker-2", s.Name)
		}
	})

	t.Run("ichor.dev/order orders the workers", func(t *testing.T) {
		out, err := c.kubectl(t, "label", "node", "worker-2", "ichor.dev/order=1")
		require.NoError(t, err, out)
		t.Cleanup(func() {
			if out, err := c.kubectl(t, "label", "node", "worker-2", "ichor.dev/order-"); err != nil {
				t.Errorf("remove the order label: %v: %s", err, out)
			}
		})
		r := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		r.requireExit(t, 0)
		require.Equal(t, []string{"cp-1", "cp-2", "cp-3", "worker-2", "worker-1"}, tableStages(r.stdout)[3].nodes)
	})

	tc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })

	t.Run("a node whose images come from a private registry keeps its repository", func(t *testing.T) {
		const registry = "registry.example.com:5000"
		cp2Starts, worker1Starts := kubeletStarts(t, c, "cp-2"), kubeletStarts(t, c, "worker-1")
		patchMachineConfig(t, tc, c.Machine(t, "cp-2").IP, func(cfg *v1alpha1.Config) {
			cfg.ClusterConfig.APIServerConfig.ContainerImage = registry + "/k8s/kube-apiserver:" + planFrom
			cfg.ClusterConfig.ControllerManagerConfig.ContainerImage = registry + "/k8s/kube-controller-manager:" + planFrom
			cfg.ClusterConfig.SchedulerConfig.ContainerImage = registry + "/k8s/kube-scheduler:" + planFrom
			cfg.MachineConfig.MachineKubelet.KubeletImage = registry + "/siderolabs/kubelet:" + planFrom
		})
		patchMachineConfig(t, tc, c.Machine(t, "worker-1").IP, func(cfg *v1alpha1.Config) {
			cfg.MachineConfig.MachineKubelet.KubeletImage = registry + "/siderolabs/kubelet:" + planFrom
		})
		waitMirrorPod(t, c, "kube-apiserver-cp-2", registry+"/k8s/kube-apiserver:"+planFrom)
		waitMirrorPod(t, c, "kube-scheduler-cp-2", registry+"/k8s/kube-scheduler:"+planFrom)
		waitMirrorPod(t, c, "kube-controller-manager-cp-2", registry+"/k8s/kube-controller-manager:"+planFrom)
		waitKubeletStart(t, c, "cp-2", cp2Starts)
		waitKubeletStart(t, c, "worker-1", worker1Starts)
		waitNodes(t, c, all, planFrom)

		r := c.plugin(t, "plan", "kubernetes", "--to", planTo, "-o", "json")
		r.requireExit(t, 0)
		plan := decodePlan(t, r.stdout)
		changes := map[string]api.Change{} // stage/node/component
		for _, s := range plan.Stages {
			for _, n := range s.Nodes {
				for _, ch := range n.Changes {
					changes[s.Name+"/"+n.Node+"/"+ch.Component] = ch
				}
			}
		}
		for key, want := range map[string]api.Change{
			"APIServers/cp-2/kube-apiserver":                      {Component: "kube-apiserver", From: registry + "/k8s/kube-apiserver:" + planFrom, To: registry + "/k8s/kube-apiserver:" + planTo},
			"ControlPlaneComponents/cp-2/kube-controller-manager": {Component: "kube-controller-manager", From: registry + "/k8s/kube-controller-manager:" + planFrom, To: registry + "/k8s/kube-controller-manager:" + planTo},
			"ControlPlaneComponents/cp-2/kube-scheduler":          {Component: "kube-scheduler", From: registry + "/k8s/kube-scheduler:" + planFrom, To: registry + "/k8s/kube-scheduler:" + planTo},
			"Kubelets/cp-2/kubelet":                               {Component: "kubelet", From: registry + "/siderolabs/kubelet:" + planFrom, To: registry + "/siderolabs/kubelet:" + planTo},
			"Kubelets/worker-1/kubelet":                           {Component: "kubelet", From: registry + "/siderolabs/kubelet:" + planFrom, To: registry + "/siderolabs/kubelet:" + planTo},
			// The other nodes keep theirs.
			"APIServers/cp-1/kube-apiserver": {Component: "kube-apiserver", From: "registry.k8s.io/kube-apiserver:" + planFrom, To: "registry.k8s.io/kube-apiserver:" + planTo},
			"KubeProxy/cp-2/kube-proxy":      {Component: "kube-proxy", From: "registry.k8s.io/kube-proxy:" + planFrom, To: "registry.k8s.io/kube-proxy:" + planTo},
			"Kubelets/worker-2/kubelet":      {Component: "kubelet", From: "ghcr.io/siderolabs/kubelet:" + planFrom, To: "ghcr.io/siderolabs/kubelet:" + planTo},
		} {
			// The path is where the node's config keeps the image: every
			// config of this Talos 1.13 cluster is in the v1alpha1 layout.
			want.Path = render.Component(want.Component).Path()
			require.Equal(t, want, changes[key], key)
		}

		table := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		table.requireExit(t, 0)
		require.Contains(t, table.stdout, registry+"/k8s/* (cp-2)")
		require.Contains(t, table.stdout, registry+"/siderolabs/* (cp-2, worker-1)")
	})

	t.Run("a node left behind at an older minor is refused by name", func(t *testing.T) {
		starts := kubeletStarts(t, c, "worker-2")
		patchMachineConfig(t, tc, c.Machine(t, "worker-2").IP, func(cfg *v1alpha1.Config) {
			cfg.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.34.5"
		})
		waitKubeletStart(t, c, "worker-2", starts)
		waitNodes(t, c, []string{"worker-2"}, "v1.34.5")
		waitNodes(t, c, all, "")

		r := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		r.requireExit(t, 2)
		r.requireOneLineError(t, "plan refused by version skew")
		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultRefused, checks["version skew"].result)
		require.Contains(t, checks["version skew"].detail, "v1.36.3 skips a minor from v1.34.5: upgrade to 1.35 first (kubelet on worker-2)")
		require.NotContains(t, checks["version skew"].detail, "worker-1")
		require.Regexp(t, `(?m)^kubelet\s+v1\.34\.5 x1, v1\.35\.4 x4\s+v1\.36\.3$`, r.stdout)

		// Holding it lets the rest go.
		out, err := c.kubectl(t, "annotate", "node", "worker-2", "ichor.dev/hold=behind")
		require.NoError(t, err, out)
		held := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		held.requireExit(t, 0)
		require.Contains(t, held.stdout, "Held: worker-2 (ichor.dev/hold: behind)")
	})
}

// TestPlanTalos plans a Talos OS upgrade of a cluster started at Talos
// v1.12.4: the installer per node, its repository kept.
func TestPlanTalos(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "1", "--workers", "2", "--kubernetes", planFrom, "--talos", planOldTal)
	ctx := context.Background()
	tc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })

	// worker-2 boots from a factory image with its own schematic.
	const factory = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"
	patchMachineConfig(t, tc, c.Machine(t, "worker-2").IP, func(cfg *v1alpha1.Config) {
		cfg.MachineConfig.MachineInstall.InstallImage = factory + ":" + planOldTal
	})

	t.Run("to v1.13.9 shows the installer per node", func(t *testing.T) {
		r := c.plugin(t, "plan", "talos", "--to", planTalos, "--allow-etcd-outage")
		r.requireExit(t, 0)
		require.Empty(t, r.stderr)
		require.Regexp(t, `(?m)^talos\s+v1\.12\.4 x3\s+v1\.13\.9$`, r.stdout)
		stages := tableStages(r.stdout)
		require.Equal(t, []string{"TalosOS"}, stageNames(stages))
		require.Equal(t, []string{"cp-1", "worker-1", "worker-2"}, stages[0].nodes)
		require.Contains(t, lineWith(r.stdout, "cp-1"), "talos v1.12.4 -> v1.13.9, installer ghcr.io/siderolabs/installer:v1.13.9")
		require.Contains(t, lineWith(r.stdout, "worker-2"), "installer "+factory+":v1.13.9")
		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultOK, checks["upgrade path"].result, checks["upgrade path"].detail)
		require.Contains(t, checks["upgrade path"].detail, "v1.12.4 -> v1.13.9")
		require.Equal(t, api.ResultOK, checks["kubernetes on target"].result, checks["kubernetes on target"].detail)
		require.Contains(t, checks["kubernetes on target"].detail, "Talos v1.13.9 supports Kubernetes 1.31-1.36")

		j := c.plugin(t, "plan", "talos", "--to", planTalos, "--allow-etcd-outage", "-o", "json")
		j.requireExit(t, 0)
		plan := decodePlan(t, j.stdout)
		require.Equal(t, api.UpgradeTalos, plan.Upgrade)
		require.Equal(t, []api.VersionCount{{Version: planOldTal, Count: 3}}, plan.Cluster.Talos)
		require.Len(t, plan.Stages, 1)
		installers := map[string]api.Change{}
		for _, n := range plan.Stages[0].Nodes {
			require.Len(t, n.Changes, 2, n.Node)
			require.Equal(t, api.Change{Component: "talos", From: planOldTal, To: planTalos}, n.Changes[0], n.Node)
			installers[n.Node] = n.Changes[1]
		}
		require.Equal(t, map[string]api.Change{
			"cp-1":     {Component: "installer", From: "ghcr.io/siderolabs/installer:" + planOldTal, To: "ghcr.io/siderolabs/installer:" + planTalos},
			"worker-1": {Component: "installer", From: "ghcr.io/siderolabs/installer:" + planOldTal, To: "ghcr.io/siderolabs/installer:" + planTalos},
			"worker-2": {Component: "installer", From: factory + ":" + planOldTal, To: factory + ":" + planTalos},
		}, installers)
	})

	t.Run("--installer-image overrides every installer", func(t *testing.T) {
		image := "registry.example.com:5000/siderolabs/installer:" + planTalos
		j := c.plugin(t, "plan", "talos", "--to", planTalos, "--allow-etcd-outage", "--installer-image", image, "-o", "json")
		j.requireExit(t, 0)
		for _, n := range decodePlan(t, j.stdout).Stages[0].Nodes {
			require.Equal(t, image, n.Changes[1].To, n.Node)
		}
		bad := c.plugin(t, "plan", "talos", "--to", planTalos, "--installer-image", "ghcr.io/siderolabs/installer:v1.13.8")
		bad.requireExit(t, 1)
		bad.requireOneLineError(t, `--installer-image "ghcr.io/siderolabs/installer:v1.13.8" is tagged v1.13.8 but --to is v1.13.9`)
	})

	t.Run("a one-member etcd is refused without --allow-etcd-outage", func(t *testing.T) {
		r := c.plugin(t, "plan", "talos", "--to", planTalos, "-o", "json")
		r.requireExit(t, 2)
		etcd := planCheck(t, decodePlan(t, r.stdout), "etcd quorum")
		require.Equal(t, api.ResultRefused, etcd.Result, etcd.Detail)
		require.Contains(t, etcd.Detail, "etcd has 1 voting member(s), quorum 1: rebooting cp-1 leaves 0")
		require.Contains(t, etcd.Action, "--allow-etcd-outage")
	})

	t.Run("a Talos minor this build does not know is refused", func(t *testing.T) {
		r := c.plugin(t, "plan", "talos", "--to", "v1.15.0")
		r.requireExit(t, 2)
		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultRefused, checks["upgrade path"].result)
		require.Contains(t, checks["upgrade path"].detail, "Talos 1.15 is newer than this build knows (Talos up to 1.14)")
	})

	t.Run("kubernetes beyond what Talos v1.12 supports is refused", func(t *testing.T) {
		r := c.plugin(t, "plan", "kubernetes", "--to", planTo)
		r.requireExit(t, 2)
		r.requireOneLineError(t, "plan refused by talos pairing")
		checks := tableChecks(r.stdout)
		require.Equal(t, api.ResultRefused, checks["talos pairing"].result)
		require.Contains(t, checks["talos pairing"].detail, "Talos v1.12.4")
		require.Contains(t, checks["talos pairing"].detail, "not v1.36.3")
	})
}

// pluginResult is one run of the plugin.
type pluginResult struct {
	args   []string
	stdout string
	stderr string
	code   int
}

func (r pluginResult) requireExit(t *testing.T, code int) {
	t.Helper()
	require.Equal(t, code, r.code, "kubectl-ichor %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// requireOneLineError checks that stderr is exactly one line, "error: ...",
// containing want.
func (r pluginResult) requireOneLineError(t *testing.T, want string) {
	t.Helper()
	t.Logf("stderr: %s", r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "error: "), "stderr: %q", r.stderr)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "stderr is not one line: %q", r.stderr)
	require.True(t, strings.HasSuffix(r.stderr, "\n"), "stderr: %q", r.stderr)
	require.Contains(t, r.stderr, want)
}

// runPlugin runs the plugin binary ($ICHOR_PLUGIN) with args in a clean
// environment: HOME is a fresh directory, KUBECONFIG and TALOSCONFIG are
// unset; env adds to (or overrides) that.
func runPlugin(t *testing.T, env []string, args ...string) pluginResult {
	t.Helper()
	bin := os.Getenv("ICHOR_PLUGIN")
	if bin == "" {
		t.Fatal("$ICHOR_PLUGIN is not set: run the local-cluster tests with make test (or make e2e)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = cleanEnv(t, env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := pluginResult{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run kubectl-ichor %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func cleanEnv(t *testing.T, extra []string) []string {
	t.Helper()
	set := map[string]string{"HOME": t.TempDir()}
	var order []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "KUBECONFIG", "TALOSCONFIG", "TALOS_HOME", "HOME":
			continue
		}
		set[k] = v
		order = append(order, k)
	}
	order = append(order, "HOME")
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		if _, found := set[k]; !found {
			order = append(order, k)
		}
		set[k] = v
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		if set[k] != "" {
			out = append(out, k+"="+set[k])
		}
	}
	return out
}

// plugin runs the plugin against c, naming its kubeconfig and talosconfig
// before args (a later flag in args wins).
func (c *Cluster) plugin(t *testing.T, args ...string) pluginResult {
	t.Helper()
	return c.pluginEnv(t, nil, args...)
}

func (c *Cluster) pluginEnv(t *testing.T, env []string, args ...string) pluginResult {
	t.Helper()
	full := append([]string{}, args...)
	full = append(full, "--kubeconfig", c.Kubeconfig)
	if !hasFlag(args, "--talosconfig") {
		full = append(full, "--talosconfig", c.Talosconfig)
	}
	return runPlugin(t, env, full...)
}

func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || strings.HasPrefix(a, flag+"=") {
			return true
		}
	}
	return false
}

// serviceAccountKubeconfig creates a ServiceAccount with no rights and
// returns a kubeconfig that authenticates as it with a token.
func (c *Cluster) serviceAccountKubeconfig(t *testing.T, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	_, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Client.CoreV1().ServiceAccounts(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	expiry := int64(3600)
	tok, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	admin, err := clientcmd.LoadFromFile(c.Kubeconfig)
	require.NoError(t, err)
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	require.NotNil(t, cluster)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["ichor-sim"] = cluster
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: "ichor-sim", AuthInfo: name}
	cfg.CurrentContext = name
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// kubeconfigWithServer returns a copy of the admin kubeconfig that points
// at server.
func (c *Cluster) kubeconfigWithServer(t *testing.T, server string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	require.NoError(t, err)
	for _, cl := range cfg.Clusters {
		cl.Server = server
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// patchMachineConfig changes a machine's active config through the Talos API
// (ApplyConfiguration, NO_REBOOT), as an operator would with talosctl.
func patchMachineConfig(t *testing.T, tc *client.Client, ip string, patch func(*v1alpha1.Config)) {
	t.Helper()
	ctx := client.WithNode(context.Background(), ip)
	mc, err := safe.StateGetByID[*config.MachineConfig](ctx, tc.COSI, config.ActiveID)
	require.NoError(t, err)
	patched, err := mc.Provider().PatchV1Alpha1(func(cfg *v1alpha1.Config) error {
		patch(cfg)
		return nil
	})
	require.NoError(t, err)
	data, err := patched.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	require.NoError(t, err)
	_, err = tc.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{Data: data, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT})
	require.NoError(t, err)
}

// waitMirrorPod waits until the mirror pod runs image and is Ready.
func waitMirrorPod(t *testing.T, c *Cluster, name, image string) {
	t.Helper()
	eventually(t, 60*time.Second, name+" Ready on "+image, func(ctx context.Context) error {
		p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.Containers[0].Image != image || !isReady(p) {
			return fmt.Errorf("image %s ready %v", p.Spec.Containers[0].Image, isReady(p))
		}
		return nil
	})
}

// kubeletStarts counts the starts of a node's kubelet in the events log.
func kubeletStarts(t *testing.T, c *Cluster, node string) int {
	t.Helper()
	n := 0
	for _, e := range c.Events(t) {
		if e.Node == node && e.Component == "kubelet" {
			n++
		}
	}
	return n
}

// waitKubeletStart waits for a start of the node's kubelet after the first
// before ones: the restart a new kubelet image causes. Until then the Node
// may still show the Ready of the kubelet that is about to stop.
func waitKubeletStart(t *testing.T, c *Cluster, node string, before int) {
	t.Helper()
	eventually(t, 60*time.Second, node+" kubelet restarted", func(context.Context) error {
		if n := kubeletStarts(t, c, node); n <= before {
			return fmt.Errorf("%d kubelet starts", n)
		}
		return nil
	})
}

// waitNodes waits until the nodes are Ready, on kubelet version when it is
// not empty.
func waitNodes(t *testing.T, c *Cluster, nodes []string, version string) {
	t.Helper()
	for _, name := range nodes {
		eventually(t, 60*time.Second, name+" Ready "+version, func(ctx context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !nodeReady(n) || (version != "" && n.Status.NodeInfo.KubeletVersion != version) {
				return fmt.Errorf("kubelet %s ready %v", n.Status.NodeInfo.KubeletVersion, nodeReady(n))
			}
			return nil
		})
	}
}

func decodePlan(t *testing.T, out string) api.Plan {
	t.Helper()
	var plan api.Plan
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&plan), out)
	require.False(t, dec.More(), "more than one document: %s", out)
	return plan
}

// tableStage is one stage as the table prints it.
type tableStage struct {
	name  string
	nodes []string
}

// tableStages reads the stages and their nodes, in order, from the table.
func tableStages(out string) []tableStage {
	var (
		stages []tableStage
		cur    *tableStage
	)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "Stage "):
			if len(f) < 3 {
				continue
			}
			stages = append(stages, tableStage{name: strings.TrimSuffix(f[2], ":")})
			cur = &stages[len(stages)-1]
		case cur != nil && strings.HasPrefix(line, "  ") && len(f) >= 3:
			// "  1.  cp-1  control-plane  ..." or "      worker-2  worker  ..."
			if strings.HasSuffix(f[0], ".") {
				f = f[1:]
			}
			if f[1] == api.RoleControlPlane || f[1] == api.RoleWorker {
				cur.nodes = append(cur.nodes, f[0])
			}
		case !strings.HasPrefix(line, "  "):
			cur = nil
		}
	}
	return stages
}

func stageNames(stages []tableStage) []string {
	var out []string
	for _, s := range stages {
		out = append(out, s.name)
	}
	return out
}

// tableCheck is one row of the CHECK table.
type tableCheck struct {
	result string
	detail string
}

// tableChecks reads the CHECK table by check name.
func tableChecks(out string) map[string]tableCheck {
	checks := map[string]tableCheck{}
	lines := strings.Split(out, "\n")
	for i, line := range lines {
		if !strings.HasPrefix(line, "CHECK ") {
			continue
		}
		resultAt := strings.Index(line, "RESULT")
		detailAt := strings.Index(line, "DETAIL")
		for _, row := range lines[i+1:] {
			if strings.TrimSpace(row) == "" || len(row) < detailAt {
				break
			}
			checks[strings.TrimSpace(row[:resultAt])] = tableCheck{
				result: strings.TrimSpace(row[resultAt:detailAt]),
				detail: strings.TrimSpace(row[detailAt:]),
			}
		}
	}
	return checks
}

func stepNodes(s api.Stage) []string {
	var out []string
	for _, n := range s.Nodes {
		out = append(out, n.Node)
	}
	return out
}

func stepBatches(s api.Stage) []string {
	var out []string
	for _, n := range s.Nodes {
		out = append(out, fmt.Sprintf("%s/%d", n.Node, n.Batch))
	}
	return out
}
