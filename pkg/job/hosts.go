package job

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// runnerTolerations are the tolerations of every runner pod: it may run on
// a control plane.
func runnerTolerations() []corev1.Toleration {
	return []corev1.Toleration{{
		Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
	}}
}

// RunnerHosts returns the nodes the runner's pod can go to, with the Job's
// tolerations, once ichor lifted its own cordons: nodes not cordoned by
// someone else, whose every NoSchedule or NoExecute taint the pod tolerates
// (the node.kubernetes.io/ taints of a node's conditions excepted: they come
// and go with a reboot). With one host or none, no other node can take the
// runner while its node is drained: the Job then stays on its node
// (JobParams.StayOnNode).
func RunnerHosts(nodes []corev1.Node) []string {
	tolerations := runnerTolerations()

	var hosts []string

nodes:
	for _, n := range nodes {
		if n.Spec.Unschedulable && n.Annotations[kube.CordonedAnnotation] == "" {
			continue
		}

		for _, t := range n.Spec.Taints {
			if t.Effect == corev1.TaintEffectPreferNoSchedule || strings.HasPrefix(t.Key, "node.kubernetes.io/") {
				continue
			}

			tolerated := false

			for _, tol := range tolerations {
				if tol.ToleratesTaint(klog.Background(), &t, false) {
					tolerated = true

					break
				}
			}

			if !tolerated {
				continue nodes
			}
		}

		hosts = append(hosts, n.Name)
	}

	return hosts
}

// StaysOnNode reports whether the runner must stay on its node through its
// drain: at most one node can host it (RunnerHosts).
func StaysOnNode(nodes []corev1.Node) bool {
	return len(RunnerHosts(nodes)) <= 1
}
