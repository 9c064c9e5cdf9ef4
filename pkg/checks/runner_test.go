package checks

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

func TestRunnerNode(t *testing.T) {
	cp := corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}
	run := func(nodes ...discovery.Node) api.Check {
		return RunnerNode{}.Run(t.Context(), &Input{Snapshot: &discovery.Snapshot{Nodes: nodes}})
	}

	one := run(discovery.Node{Name: "cp-1", ControlPlane: true, Taints: []corev1.Taint{cp}})
	assert.Equal(t, api.ResultOK, one.Result)
	assert.Contains(t, one.Detail, "single node cp-1: the runner stays on it through its own drain and reboot")

	three := run(discovery.Node{Name: "cp-1", Taints: []corev1.Taint{cp}}, discovery.Node{Name: "cp-2", Taints: []corev1.Taint{cp}}, discovery.Node{Name: "cp-3", Taints: []corev1.Taint{cp}})
	assert.Equal(t, api.ResultOK, three.Result)
	assert.Contains(t, three.Detail, "3 nodes can host the Job (cp-1, cp-2, cp-3): the runner stays on its node through a kubelet restart and moves off it before a reboot")

	none := run(discovery.Node{Name: "cp-1", Unschedulable: true, Taints: []corev1.Taint{cp}})
	assert.Equal(t, api.ResultRefused, none.Result)
	assert.Contains(t, none.Action, "kubectl uncordon")
}
