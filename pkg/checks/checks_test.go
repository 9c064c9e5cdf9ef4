package checks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// fakeMetrics serves a fixed /metrics body or error.
type fakeMetrics struct {
	body string
	err  error
}

func (f fakeMetrics) Metrics(context.Context) ([]byte, error) { return []byte(f.body), f.err }

const deprecatedMetrics = `# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested.
# TYPE apiserver_requested_deprecated_apis gauge
apiserver_requested_deprecated_apis{group="flowcontrol.apiserver.k8s.io",removed_release="1.32",resource="prioritylevelconfigurations",subresource="",version="v1beta3"} 1
apiserver_requested_deprecated_apis{group="",removed_release="1.40",resource="endpoints",subresource="",version="v1"} 1
# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",verb="GET"} 42
`

func TestChecks(t *testing.T) {
	k8s := stages.MustParseVersion("v1.36.3")

	tests := []struct {
		name    string
		check   checks.Check
		cluster func(c *discoverytest.Cluster)
		target  stages.Version
		metrics checks.MetricsReader
		result  string
		detail  []string
		action  string
	}{
		// invariant
		{name: "invariant holds", check: checks.Invariant{}, result: api.ResultOK, detail: []string{"nothing newer than the oldest apiserver (v1.35.4 on cp-1)"}},
		{
			name: "invariant: skew already there is a warning", check: checks.Invariant{},
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-2").Versions = map[discovery.Component]string{discovery.Kubelet: "v1.36.3"}
				c.Node("worker-2").Hold = discoverytest.Ptr("newer")
			},
			result: api.ResultWarn, detail: []string{"skew already there: kubelet v1.36.3 on worker-2 (Node worker-2) is newer than kube-apiserver v1.35.4 on cp-1"},
			action: "the upgrade keeps it from growing and moves the apiservers first",
		},
		{
			name: "invariant: a held control plane behind the target stops the upgrade after the apiservers", check: checks.Invariant{},
			cluster: func(c *discoverytest.Cluster) { c.Node("cp-3").Hold = discoverytest.Ptr("RMA") },
			result:  api.ResultWarn,
			detail:  []string{"held control plane cp-3 keeps its kube-apiserver behind v1.36.3: the upgrade stops before the ControlPlaneComponents stage"},
			action:  "remove the hold before, or when the upgrade pauses there (kubectl annotate node cp-3 ichor.dev/hold-), then resume",
		},
		{
			name: "invariant: an apiserver version that cannot be read refuses", check: checks.Invariant{},
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-2").Versions = map[discovery.Component]string{discovery.APIServer: "v1.35.4-custom"}
			},
			result: api.ResultRefused, detail: []string{"apiserver version unknown: kube-apiserver on cp-2: image ", "v1.35.4-custom", "has no vMAJOR.MINOR.PATCH tag"},
			action: "give kube-apiserver on cp-2 an image tagged vMAJOR.MINOR.PATCH",
		},
		// version skew
		{name: "skew one minor", check: checks.VersionSkew{}, result: api.ResultOK, detail: []string{"one minor (1.35 -> 1.36), no node behind"}},
		{name: "skew patch", check: checks.VersionSkew{}, target: stages.MustParseVersion("v1.35.6"), result: api.ResultOK, detail: []string{"patch upgrade within 1.35"}},
		{
			name: "skew skipped minor names the minor to go first", check: checks.VersionSkew{},
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-2").Kubernetes = "v1.34.7" },
			result:  api.ResultRefused, detail: []string{"kubelet on worker-2", "upgrade to 1.35 first"},
		},
		{
			name: "skew downgrade", check: checks.VersionSkew{}, target: stages.MustParseVersion("v1.35.1"),
			result: api.ResultRefused, detail: []string{"downgrades are not supported"},
		},
		{
			name: "skew ignores held nodes", check: checks.VersionSkew{},
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-2").Kubernetes = "v1.34.7"
				c.Node("worker-2").Hold = discoverytest.Ptr("old")
			},
			result: api.ResultOK,
		},
		{
			name: "skew judges the static pods a node runs", check: checks.VersionSkew{},
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-2").Versions = map[discovery.Component]string{discovery.Scheduler: "v1.34.1"}
			},
			result: api.ResultRefused, detail: []string{"kube-scheduler", "on cp-2", "upgrade to 1.35 first"},
		},
		// talos pairing
		{name: "pairing ok", check: checks.TalosPairing{}, result: api.ResultOK, detail: []string{"Talos v1.13.9 supports Kubernetes 1.31-1.36"}},
		{
			name: "pairing target too new", check: checks.TalosPairing{}, target: stages.MustParseVersion("v1.37.0"),
			result: api.ResultRefused, detail: []string{"Talos v1.13.9 (on cp-1, cp-2, cp-3, worker-1, worker-2) supports Kubernetes 1.31-1.36, not v1.37.0"},
			action: "upgrade Talos to 1.14 first: kubectl ichor upgrade talos --to v1.14.1",
		},
		{
			name: "pairing 1.37 on Talos 1.14", check: checks.TalosPairing{}, target: stages.MustParseVersion("v1.37.2"),
			cluster: func(c *discoverytest.Cluster) {
				for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
					c.Node(n).Talos = "v1.14.1"
				}
			},
			result: api.ResultOK, detail: []string{"Talos v1.14.1 supports Kubernetes 1.32-1.37"},
		},
		{
			name: "pairing 1.37 with some nodes still on Talos 1.13", check: checks.TalosPairing{}, target: stages.MustParseVersion("v1.37.2"),
			cluster: func(c *discoverytest.Cluster) {
				for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
					c.Node(n).Talos = "v1.14.1"
				}
				c.Node("worker-2").Talos = "v1.13.9"
			},
			result: api.ResultRefused, detail: []string{"Talos v1.13.9 (on worker-2) supports Kubernetes 1.31-1.36, not v1.37.2"},
			action: "kubectl ichor upgrade talos --to v1.14.1",
		},
		{
			name: "pairing unknown Talos minor", check: checks.TalosPairing{},
			cluster: func(c *discoverytest.Cluster) { c.Node("cp-1").Talos = "v1.15.0" },
			result:  api.ResultRefused, detail: []string{"Talos 1.15 (on cp-1) is newer than this build knows (Talos up to 1.14)"},
			action: "upgrade kubectl-ichor",
		},
		// nodes ready
		{name: "ready", check: checks.NodesReady{}, result: api.ResultOK, detail: []string{"5/5"}},
		{
			name: "not ready", check: checks.NodesReady{}, cluster: func(c *discoverytest.Cluster) { c.Node("worker-1").NotReady = true },
			result: api.ResultRefused, detail: []string{"4/5 Ready; not Ready: worker-1"}, action: "kubectl annotate node worker-1 ichor.dev/hold=",
		},
		{
			name: "starting", check: checks.NodesReady{},
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-1").NotReady, c.Node("worker-1").NotReadySince = true, time.Now().Add(-10*time.Second)
			},
			result: api.ResultWarn, detail: []string{"4/5 Ready; starting: worker-1 (NotReady since ", "the upgrade waits for each to come Ready, up to 5m0s after it turned NotReady"},
			action: "kubectl annotate node worker-1 ichor.dev/hold=",
		},
		{
			name: "starting and not ready", check: checks.NodesReady{},
			cluster: func(c *discoverytest.Cluster) {
				c.Node("worker-1").NotReady, c.Node("worker-1").NotReadySince = true, time.Now().Add(-10*time.Second)
				c.Node("worker-2").NotReady = true
			},
			result: api.ResultRefused, detail: []string{"3/5 Ready; not Ready: worker-1, worker-2"},
		},
		{
			name: "cordoned", check: checks.NodesReady{}, cluster: func(c *discoverytest.Cluster) { c.Node("worker-1").Cordoned = true },
			result: api.ResultWarn, detail: []string{"cordoned: worker-1"},
		},
		// not Talos
		{name: "all Talos", check: checks.NotTalos{}, result: api.ResultOK},
		{
			name: "not Talos", check: checks.NotTalos{}, cluster: func(c *discoverytest.Cluster) { c.Node("worker-2").OSImage = "Ubuntu 24.04" },
			result: api.ResultRefused, detail: []string{`worker-2 runs "Ubuntu 24.04"`},
		},
		// held
		{name: "none held", check: checks.HeldNodes{}, result: api.ResultOK, detail: []string{"none"}},
		{
			name: "held", check: checks.HeldNodes{}, cluster: func(c *discoverytest.Cluster) { c.Node("worker-2").Hold = discoverytest.Ptr("") },
			result: api.ResultWarn, detail: []string{"worker-2 held"},
		},
		// endpoint
		{
			name: "endpoint is a VIP", check: checks.Endpoint{}, result: api.ResultOK,
			detail: []string{"https://192.168.0.100:6443 is not a single control plane"},
		},
		{
			name: "endpoint is one control plane", check: checks.Endpoint{},
			cluster: func(c *discoverytest.Cluster) { c.Node("cp-2").IP = "192.168.0.100" },
			result:  api.ResultWarn, detail: []string{"is a single control plane (cp-2)"}, action: "VIP or a load balancer",
		},
		{
			name: "endpoint on a patch upgrade", check: checks.Endpoint{}, target: stages.MustParseVersion("v1.35.6"),
			cluster: func(c *discoverytest.Cluster) { c.Node("cp-2").IP = "192.168.0.100" },
			result:  api.ResultOK, detail: []string{"patch upgrade"},
		},
		// removed APIs
		{
			name: "removed APIs requested", check: checks.RemovedAPIs{}, metrics: fakeMetrics{body: deprecatedMetrics},
			result: api.ResultWarn, detail: []string{"flowcontrol.apiserver.k8s.io/v1beta3 prioritylevelconfigurations requested (removed in 1.32)"},
		},
		{
			name: "deprecated but not removed by the target", check: checks.RemovedAPIs{}, metrics: fakeMetrics{body: deprecatedMetrics},
			target: stages.MustParseVersion("v1.31.0"), result: api.ResultOK,
		},
		{
			name: "metrics forbidden", check: checks.RemovedAPIs{},
			metrics: fakeMetrics{err: apierrors.NewForbidden(schema.GroupResource{}, "/metrics", errors.New("RBAC"))},
			result:  api.ResultWarn, detail: []string{"could not run", "/metrics"},
		},
		{
			name: "metrics unparsable", check: checks.RemovedAPIs{}, metrics: fakeMetrics{body: "not { metrics"},
			result: api.ResultWarn, detail: []string{"could not run"},
		},
		// talos access
		{name: "talos access ok", check: checks.TalosAccess{}, result: api.ResultOK, detail: []string{"allows os:admin in ichor-system"}},
		{
			name: "talos access missing", check: checks.TalosAccess{},
			cluster: func(c *discoverytest.Cluster) {
				c.Node("cp-2").APIAccess = &v1alpha1.KubernetesTalosAPIAccessConfig{
					AccessEnabled: discoverytest.Ptr(true), AccessAllowedRoles: []string{"os:reader"}, AccessAllowedKubernetesNamespaces: []string{"kube-system"},
				}
			},
			result: api.ResultWarn, detail: []string{"on cp-2 does not allow os:admin in ichor-system"},
			action: `talosctl patch mc --nodes 10.0.0.12 --patch @ichor-talos-access.yaml) with:
machine:
  features:
    kubernetesTalosAPIAccess:
      enabled: true
      allowedRoles:
        - os:reader
        - os:admin
      allowedKubernetesNamespaces:
        - kube-system
        - ichor-system
`,
		},
		// talos upgrade path
		{name: "talos path", check: checks.UpgradePath{}, target: stages.MustParseVersion("v1.13.9"), result: api.ResultOK},
		{
			name: "talos path too old", check: checks.UpgradePath{}, target: stages.MustParseVersion("v1.13.9"),
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-1").Talos = "v1.10.3" },
			result:  api.ResultRefused, detail: []string{"worker-1: host version 1.10.3 is too old"},
		},
		{
			name: "talos downgrade", check: checks.UpgradePath{}, target: stages.MustParseVersion("v1.13.2"),
			result: api.ResultRefused, detail: []string{"downgrades are not supported"},
		},
		{
			name: "talos target unknown", check: checks.UpgradePath{}, target: stages.MustParseVersion("v1.15.0"),
			result: api.ResultRefused, detail: []string{"Talos 1.15 is newer than this build knows (Talos up to 1.14)"},
		},
		{
			name: "kubernetes on target talos", check: checks.KubernetesSupported{}, target: stages.MustParseVersion("v1.13.9"),
			result: api.ResultOK, detail: []string{"supports Kubernetes 1.31-1.36"},
		},
		{
			name: "kubernetes too old for target talos", check: checks.KubernetesSupported{}, target: stages.MustParseVersion("v1.13.9"),
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-2").Kubernetes = "v1.30.4" },
			result:  api.ResultRefused, detail: []string{"Kubernetes v1.30.4 (kubelet on worker-2) is outside 1.31-1.36"},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := discoverytest.ThreePlusTwo()
			if tt.cluster != nil {
				tt.cluster(c)
			}

			target := tt.target
			if target == (stages.Version{}) {
				target = k8s
			}

			in := &checks.Input{Snapshot: c.Snapshot(t), Target: target, Namespace: "ichor-system", Metrics: tt.metrics}
			got := checks.Run(context.Background(), []checks.Check{tt.check}, in)[0]

			assert.Equal(t, tt.check.Name(), got.Name)
			assert.Equal(t, tt.result, got.Result, "detail: %s", got.Detail)
			assert.NotContains(t, got.Detail, "\n")

			for _, d := range tt.detail {
				assert.Contains(t, got.Detail, d)
			}

			if tt.action != "" {
				assert.Contains(t, got.Action, tt.action)
			}

			if got.Result != api.ResultOK && tt.check.Name() != "removed APIs" {
				assert.NotEmpty(t, got.Action, "a WARN or REFUSED says what to do")
			}
		})
	}
}

func TestRefused(t *testing.T) {
	assert.False(t, checks.Refused([]api.Check{{Result: api.ResultOK}, {Result: api.ResultWarn}}))
	assert.True(t, checks.Refused([]api.Check{{Result: api.ResultOK}, {Result: api.ResultRefused}}))
}

func TestBootstrapManifestsCheck(t *testing.T) {
	run := func(f *checks.ManifestFindings) api.Check {
		return checks.BootstrapManifests{}.Run(context.Background(), &checks.Input{Manifests: f})
	}

	r := run(&checks.ManifestFindings{Node: "cp-1", Objects: 10, Skipped: []kube.Skipped{
		{Object: "ConfigMap kube-system/coredns", Conflict: `Apply failed with 1 conflict: conflict with "helm": .data.Corefile`},
	}})
	assert.Equal(t, api.ResultWarn, r.Result)
	assert.Equal(t, `1 of 10 object(s) of cp-1 changed by another field manager, the sync skips them: `+
		`ConfigMap kube-system/coredns (Apply failed with 1 conflict: conflict with "helm": .data.Corefile)`, r.Detail)
	assert.Contains(t, r.Action, `--manifests-force "ConfigMap kube-system/coredns"`)

	r = run(&checks.ManifestFindings{Node: "cp-1", Objects: 10})
	assert.Equal(t, api.ResultOK, r.Result)

	r = run(nil)
	assert.Equal(t, api.ResultWarn, r.Result, "not read is not OK")

	// Talos' own earlier writes are said, and taken over.
	talos := []kube.Holder{{Manager: "talos", Operation: "Update"}}
	r = run(&checks.ManifestFindings{Node: "cp-1", Objects: 10, TakenOver: []kube.TakenOver{{Object: "DaemonSet kube-system/kube-proxy", From: talos}}})
	assert.Equal(t, api.ResultOK, r.Result)
	assert.Contains(t, r.Detail, `1 held by Talos' own earlier writes, taken over: DaemonSet kube-system/kube-proxy (from "talos" (Update))`)

	// The kube-proxy DaemonSet held by another manager: the rollout could never come.
	r = checks.BootstrapManifests{}.Run(context.Background(), &checks.Input{Target: stages.MustParseVersion("v1.36.3"), Manifests: &checks.ManifestFindings{
		Node: "cp-1", Objects: 10, Skipped: []kube.Skipped{{
			Object:   "DaemonSet kube-system/kube-proxy",
			Conflict: `Apply failed with 1 conflict: conflict with "helm" using apps/v1: .spec.template.spec.containers[name="kube-proxy"].image`,
			Holders:  []kube.Holder{{Manager: "helm", Operation: "Update"}},
		}},
	}})
	assert.Equal(t, api.ResultRefused, r.Result)
	assert.Contains(t, r.Detail, `DaemonSet kube-system/kube-proxy of cp-1 at v1.36.3: field manager "helm" (Update) holds fields the sync would change`)
	assert.Contains(t, r.Detail, "kube-proxy would never reach v1.36.3")
	assert.Contains(t, r.Action, `kubectl ichor upgrade kubernetes --to v1.36.3 --manifests-force "DaemonSet kube-system/kube-proxy"`)
}

// TestKubeProxyRolloutCheck: a NotReady node, held as the plan advises, takes the only
// slot of kube-proxy's rollout: plan warns, naming the node and what to do.
func TestKubeProxyRolloutCheck(t *testing.T) {
	run := func(maxUnavailable int, nodes ...discovery.Node) api.Check {
		snap := &discovery.Snapshot{Nodes: nodes, KubeProxy: discovery.KubeProxyInfo{Present: true, Image: "registry.k8s.io/kube-proxy:v1.35.4", MaxUnavailable: maxUnavailable}}

		return checks.KubeProxyRollout{}.Run(context.Background(), &checks.Input{Snapshot: snap, Target: stages.MustParseVersion("v1.36.3")})
	}

	r := run(1, discovery.Node{Name: "cp-1", Ready: true}, discovery.Node{Name: "worker-1", Ready: true})
	assert.Equal(t, api.ResultOK, r.Result)

	r = run(1, discovery.Node{Name: "cp-1", Ready: true}, discovery.Node{Name: "worker-2", Held: true})
	assert.Equal(t, api.ResultWarn, r.Result)
	assert.Equal(t, "worker-2 (held) NotReady: its kube-proxy pod cannot become Ready and takes 1 of the DaemonSet's 1 unavailable slot(s) (maxUnavailable), "+
		"so no other pod can be replaced: the KubeProxy stage pauses at its rollout", r.Detail)
	assert.Contains(t, r.Action, "kubectl delete node worker-2")

	r = run(3, discovery.Node{Name: "cp-1", Ready: true}, discovery.Node{Name: "worker-2", Held: true})
	assert.Equal(t, api.ResultWarn, r.Result, "slots left, but the rollout cannot finish")
	assert.Contains(t, r.Detail, "the rollout cannot finish while it is down")

	snap := &discovery.Snapshot{Nodes: []discovery.Node{{Name: "worker-2"}}}
	assert.Equal(t, api.ResultOK, checks.KubeProxyRollout{}.Run(context.Background(), &checks.Input{Snapshot: snap}).Result, "kube-proxy disabled")
}

// TestKernelArgsCheck warns, per node, where Talos' lifecycle upgrade drops
// machine.install.extraKernelArgs: GRUB without the UKI command line, on a node upgraded
// through LifecycleService (Talos 1.13+). A node that boots a UKI, one on the UKI's
// command line, and a Talos 1.12 node (MachineService.Upgrade carries them) are not named.
func TestKernelArgsCheck(t *testing.T) {
	node := func(name, version string, args []string, ukiCmdline bool, installed *talos.Installed) discovery.Node {
		cfg := container.NewV1Alpha1(&v1alpha1.Config{MachineConfig: &v1alpha1.MachineConfig{
			MachineType: "worker",
			MachineInstall: &v1alpha1.InstallConfig{
				InstallExtraKernelArgs: args, InstallGrubUseUKICmdline: &ukiCmdline,
			},
		}})

		return discovery.Node{Name: name, Ready: true, Talos: &discovery.Talos{Version: version, Config: cfg, Installed: installed}}
	}
	grub := &talos.Installed{Platform: "metal"}
	sdboot := &talos.Installed{Platform: "metal", BootedWithUKI: true}
	args := []string{"console=ttyS1", "net.ifnames=0"}

	run := func(nodes ...discovery.Node) api.Check {
		return checks.KernelArgs{}.Run(context.Background(), &checks.Input{Snapshot: &discovery.Snapshot{Nodes: nodes}, Target: stages.MustParseVersion("v1.14.1")})
	}

	r := run(
		node("cp-1", "v1.13.9", nil, false, grub),
		node("worker-1", "v1.13.9", args, false, grub),
		node("worker-2", "v1.13.9", args, false, sdboot),
		node("worker-3", "v1.13.9", args, true, grub),
		node("worker-4", "v1.12.4", args, false, grub),
	)
	assert.Equal(t, api.ResultWarn, r.Result)
	assert.Equal(t, "worker-1 (console=ttyS1 net.ifnames=0): GRUB without the UKI command line; Talos' lifecycle upgrade does not carry "+
		"machine.install.extraKernelArgs (siderolabs/talos#13967): they boot v1.14.1 without them", r.Detail)
	assert.Contains(t, r.Action, "customization.extraKernelArgs")
	assert.Contains(t, r.Action, "talosctl upgrade --legacy")

	r = run(node("worker-1", "v1.13.9", args, false, nil))
	assert.Equal(t, api.ResultWarn, r.Result)
	assert.Contains(t, r.Detail, "its boot loader was not read")

	r = run(node("worker-2", "v1.13.9", args, false, sdboot), node("cp-1", "v1.13.9", nil, false, grub))
	assert.Equal(t, api.ResultOK, r.Result)
}

// TestStagedConfigCheck: a node whose persistent machine config differs from
// its active one is refused, named with where; nodes whose persistent config
// was not read make a warning; none staged is OK.
func TestStagedConfigCheck(t *testing.T) {
	target := stages.MustParseVersion("v1.14.1")
	c := discoverytest.ThreePlusTwo()

	discover := func(t *testing.T, fake *discoverytest.FakeTalos, persistent bool) *checks.Input {
		t.Helper()

		d := &discovery.Discoverer{Kube: c.Clientset(), Endpoint: discoverytest.Endpoint, Talos: fake}
		if persistent {
			d.Persistent = fake
		}

		snap, err := d.Discover(context.Background())
		require.NoError(t, err)

		return &checks.Input{Snapshot: snap, Target: target}
	}

	t.Run("none staged", func(t *testing.T) {
		r := checks.StagedConfig{}.Run(context.Background(), discover(t, c.Talos(), true))
		assert.Equal(t, api.ResultOK, r.Result, r.Detail)
		assert.Equal(t, "no machine config change staged on 5 node(s)", r.Detail)
	})

	t.Run("not read", func(t *testing.T) {
		r := checks.StagedConfig{}.Run(context.Background(), discover(t, c.Talos(), false))
		assert.Equal(t, api.ResultWarn, r.Result, r.Detail)
	})

	t.Run("worker-2 staged", func(t *testing.T) {
		fake := c.Talos()
		staged, err := fake.Configs["10.0.0.22"].PatchV1Alpha1(func(cfg *v1alpha1.Config) error {
			cfg.MachineConfig.MachineNodeLabels = map[string]string{"rack": "r2"}

			return nil
		})
		require.NoError(t, err)

		fake.Persistent = map[string]config.Provider{"10.0.0.22": staged}

		r := checks.StagedConfig{}.Run(context.Background(), discover(t, fake, true))
		assert.Equal(t, api.ResultRefused, r.Result, r.Detail)
		assert.Contains(t, r.Detail, "worker-2: a machine config change is staged for the next reboot (at machine.nodeLabels.rack)")
		assert.Contains(t, r.Detail, "the upgrade's reboot would activate it")
		assert.Contains(t, r.Action, "talosctl -n 10.0.0.22 reboot")
	})
}
