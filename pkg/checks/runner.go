package checks

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// RunnerNode says where the Job's pod runs. It stays on its node through
// that node's drain and kubelet restart (a Kubernetes upgrade); before its
// node's reboot (a Talos upgrade) it moves to another node that can host it.
// With a single host (one node, or every other one cordoned or tainted) it
// stays on its node through its reboot too (job.StaysOnNode); with none it
// is refused, since the Job's pod would stay Pending.
type RunnerNode struct{}

// Name implements Check.
func (RunnerNode) Name() string { return "runner node" }

// Run implements Check.
func (RunnerNode) Run(_ context.Context, in *Input) api.Check {
	nodes := make([]corev1.Node, 0, len(in.Snapshot.Nodes))

	for _, n := range in.Snapshot.Nodes {
		nodes = append(nodes, corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Spec:       corev1.NodeSpec{Unschedulable: n.Unschedulable, Taints: n.Taints},
		})
	}

	hosts := job.RunnerHosts(nodes)

	switch len(hosts) {
	case 0:
		return refused("no node can host the Job's pod (every node cordoned, or tainted NoSchedule beyond the control-plane taint)",
			"uncordon a node (kubectl uncordon NODE) or remove its taint, then plan again")
	case 1:
		return ok(fmt.Sprintf("single node %s: the runner stays on it through its own drain and reboot (or kubelet restart), tolerating the cordon; the Job's next pod continues from the state", hosts[0]))
	}

	return ok(fmt.Sprintf("%d nodes can host the Job (%s): the runner stays on its node through a kubelet restart and moves off it before a reboot", len(hosts), text.SummarizeList(hosts)))
}
