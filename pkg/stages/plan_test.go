package stages_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// changed returns "component from-tag->to-tag" for a step's changes.
func changed(step api.NodeStep) []string {
	out := []string{}
	for _, c := range step.Changes {
		out = append(out, c.Component+" "+c.From+" -> "+c.To)
	}

	return out
}

func TestPlanKubernetesPinRule(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("cp-2").Registry = "registry.example.com:5000/mirror"

	plan, err := stages.PlanKubernetes(c.Snapshot(t), stages.MustParseVersion("v1.36.3"), stages.Options{})
	require.NoError(t, err)
	require.Len(t, plan.Stages, 4)

	stageNames := []string{}
	for _, s := range plan.Stages {
		stageNames = append(stageNames, s.Name)
	}

	assert.Equal(t, []string{"APIServers", "ControlPlaneComponents", "KubeProxy", "Kubelets"}, stageNames)

	byNode := func(s api.Stage, name string) api.NodeStep {
		for _, n := range s.Nodes {
			if n.Node == name {
				return n
			}
		}

		t.Fatalf("stage %s has no node %s", s.Name, name)

		return api.NodeStep{}
	}

	// Each stage changes only its own components, against what the earlier stages leave,
	// and keeps the image repository.
	assert.Equal(t, []string{
		"kube-apiserver registry.example.com:5000/mirror/kube-apiserver:v1.35.4 -> registry.example.com:5000/mirror/kube-apiserver:v1.36.3",
	}, changed(byNode(plan.Stages[0], "cp-2")))
	assert.Equal(t, []string{
		"kube-controller-manager registry.k8s.io/kube-controller-manager:v1.35.4 -> registry.k8s.io/kube-controller-manager:v1.36.3",
		"kube-scheduler registry.k8s.io/kube-scheduler:v1.35.4 -> registry.k8s.io/kube-scheduler:v1.36.3",
	}, changed(byNode(plan.Stages[1], "cp-1")))
	assert.Equal(t, []string{
		"kube-proxy registry.k8s.io/kube-proxy:v1.35.4 -> registry.k8s.io/kube-proxy:v1.36.3",
	}, changed(byNode(plan.Stages[2], "cp-3")))
	assert.Equal(t, []string{
		"kubelet ghcr.io/siderolabs/kubelet:v1.35.4 -> ghcr.io/siderolabs/kubelet:v1.36.3",
	}, changed(byNode(plan.Stages[3], "cp-1")))
	assert.Equal(t, []string{
		"kubelet ghcr.io/siderolabs/kubelet:v1.35.4 -> ghcr.io/siderolabs/kubelet:v1.36.3",
	}, changed(byNode(plan.Stages[3], "worker-2")))

	// Only the Kubelets stage visits workers.
	for _, s := range plan.Stages[:3] {
		for _, n := range s.Nodes {
			assert.Equal(t, api.RoleControlPlane, n.Role, "stage %s", s.Name)
		}
	}
}

func TestPlanKubernetesStageRender(t *testing.T) {
	// What each stage sets on a control plane, engine view: every component against the
	// node's config as it is now.
	n := discoverytest.ThreePlusTwo().Snapshot(t).Nodes[0]
	target := stages.MustParseVersion("v1.36.3")

	tests := []struct {
		stage stages.KubernetesStage
		want  map[discovery.Component]string
	}{
		{stages.APIServers{}, map[discovery.Component]string{
			discovery.APIServer: "v1.36.3", discovery.ControllerManager: "v1.35.4", discovery.Scheduler: "v1.35.4",
			discovery.KubeProxy: "v1.35.4", discovery.Kubelet: "v1.35.4",
		}},
		{stages.ControlPlaneComponents{}, map[discovery.Component]string{
			discovery.APIServer: "v1.36.3", discovery.ControllerManager: "v1.36.3", discovery.Scheduler: "v1.36.3",
			discovery.KubeProxy: "v1.35.4", discovery.Kubelet: "v1.35.4",
		}},
		{stages.KubeProxy{}, map[discovery.Component]string{
			discovery.APIServer: "v1.36.3", discovery.ControllerManager: "v1.36.3", discovery.Scheduler: "v1.36.3",
			discovery.KubeProxy: "v1.36.3", discovery.Kubelet: "v1.35.4",
		}},
		{stages.Kubelets{}, map[discovery.Component]string{
			discovery.APIServer: "v1.36.3", discovery.ControllerManager: "v1.36.3", discovery.Scheduler: "v1.36.3",
			discovery.KubeProxy: "v1.36.3", discovery.Kubelet: "v1.36.3",
		}},
	}

	for _, tt := range tests {
		t.Run(tt.stage.Name(), func(t *testing.T) {
			got := map[discovery.Component]string{}

			for c, image := range n.Talos.Images {
				v, err := stages.DesiredVersion(tt.stage, n, c, image, target)
				require.NoError(t, err)

				got[c] = v.String()
			}

			assert.Equal(t, tt.want, got)
		})
	}
}

func TestPlanKubernetesPinNeverDowngrades(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	// A partly upgraded node: its scheduler already moved, its kubelet did not.
	c.Node("cp-1").Versions = map[discovery.Component]string{discovery.Scheduler: "v1.36.3"}

	n, _ := c.Snapshot(t).Node("cp-1")

	changes, err := stages.KubernetesChanges(stages.APIServers{}, n, stages.MustParseVersion("v1.36.3"))
	require.NoError(t, err)
	assert.Equal(t, []string{
		"kube-apiserver registry.k8s.io/kube-apiserver:v1.35.4 -> registry.k8s.io/kube-apiserver:v1.36.3",
	}, changed(api.NodeStep{Changes: changes}))
}

func TestPlanKubernetesShowsHeldAtTargetAndSkippedKubeProxy(t *testing.T) {
	c := discoverytest.ThreePlusTwo().WithoutKubeProxy()
	c.Node("worker-1").Hold = discoverytest.Ptr("")
	c.Node("worker-2").Kubernetes = "v1.36.3"

	plan, err := stages.PlanKubernetes(c.Snapshot(t), stages.MustParseVersion("v1.36.3"), stages.Options{MaxUnavailable: 2})
	require.NoError(t, err)

	assert.Equal(t, []api.NodeNote{{Node: "worker-1", Reason: "ichor.dev/hold"}}, plan.Held)
	assert.Equal(t, []string{"worker-2"}, plan.AtTarget)
	assert.True(t, plan.Stages[2].Skipped)
	assert.Contains(t, plan.Stages[2].SkipReason, "kube-proxy is disabled")

	for _, s := range plan.Stages {
		for _, n := range s.Nodes {
			assert.NotContains(t, []string{"worker-1", "worker-2"}, n.Node, "stage %s", s.Name)
		}
	}
}

func TestPlanKubernetesBatches(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Worker("worker-3", "10.0.0.23")

	plan, err := stages.PlanKubernetes(c.Snapshot(t), stages.MustParseVersion("v1.36.3"), stages.Options{MaxUnavailable: 2, Self: "cp-1"})
	require.NoError(t, err)

	got := []string{}
	for _, n := range plan.Stages[3].Nodes {
		got = append(got, n.Node+"@"+string(rune('0'+n.Batch)))
	}

	assert.Equal(t, []string{"cp-2@1", "cp-3@2", "cp-1@3", "worker-1@4", "worker-2@4", "worker-3@5"}, got)
	assert.True(t, plan.Stages[3].Nodes[2].Self)
}

func TestPlanTalos(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	for _, name := range []string{"cp-1", "cp-2", "cp-3", "worker-1"} {
		c.Node(name).Talos = "v1.12.4"
	}

	snap := c.Snapshot(t)
	cp1, _ := snap.Node("cp-1")
	cp1.Talos.InstallImage = "factory.talos.dev/installer/abc123:v1.12.4"
	snap.Nodes[0] = cp1

	plan, err := stages.PlanTalos(snap, stages.MustParseVersion("v1.13.9"), stages.InstallerFlags{}, stages.Options{})
	require.NoError(t, err)
	require.Len(t, plan.Stages, 1)
	assert.Equal(t, "TalosOS", plan.Stages[0].Name)
	assert.Equal(t, []string{"worker-2"}, plan.AtTarget)
	assert.Equal(t, []string{
		"talos v1.12.4 -> v1.13.9",
		"installer factory.talos.dev/installer/abc123:v1.12.4 -> factory.talos.dev/installer/abc123:v1.13.9",
	}, changed(plan.Stages[0].Nodes[0]))

	plan, err = stages.PlanTalos(snap, stages.MustParseVersion("v1.13.9"), stages.InstallerFlags{Image: "my.registry/installer:v1.13.9"}, stages.Options{})
	require.NoError(t, err)
	assert.Equal(t, "my.registry/installer:v1.13.9", plan.Stages[0].Nodes[1].Changes[1].To)
}

// A digest the user pinned cannot follow a new tag: the plan says it is dropped.
func TestPlanKubernetesSaysADroppedDigest(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	n, _ := c.Snapshot(t).Node("cp-1")

	digest := "sha256:" + strings.Repeat("ab", 32)
	n.Talos.Images[discovery.APIServer] = "registry.k8s.io/kube-apiserver:v1.35.4@" + digest

	changes, err := stages.KubernetesChanges(stages.APIServers{}, n, stages.MustParseVersion("v1.36.3"))
	require.NoError(t, err)
	require.Len(t, changes, 1)
	assert.Equal(t, "registry.k8s.io/kube-apiserver:v1.36.3", changes[0].To)
	assert.Equal(t, digest, changes[0].DroppedDigest)
}
