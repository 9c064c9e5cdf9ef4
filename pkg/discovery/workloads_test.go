package discovery_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
)

// TestWorkloadsKubeProxyPodReady: the mean start to Ready of the kube-proxy
// DaemonSet's pods; a pod Ready again long after its start (a restart, a reboot),
// one not Ready, and another DaemonSet's pod say nothing of it.
func TestWorkloadsKubeProxyPodReady(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	ready := func(p *corev1.Pod, started, readyAfter time.Duration, status corev1.ConditionStatus) {
		p.Status.StartTime = &metav1.Time{Time: t0.Add(started)}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.NewTime(t0.Add(started + readyAfter))}}
	}

	c := discoverytest.ThreePlusTwo()
	// The builder has the kube-proxy DaemonSet: its pods name it as their controller.
	proxy := func(node, name string) *corev1.Pod {
		p := c.Pod(node, "kube-system", name, "")
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "kube-proxy", Controller: discoverytest.Ptr(true)}}

		return p
	}

	ready(proxy("cp-1", "kube-proxy-a"), 0, 1800*time.Millisecond, corev1.ConditionTrue)
	ready(proxy("cp-2", "kube-proxy-b"), time.Minute, 1300*time.Millisecond, corev1.ConditionTrue)
	ready(proxy("cp-3", "kube-proxy-c"), 0, 72*time.Hour, corev1.ConditionTrue)
	ready(proxy("worker-1", "kube-proxy-d"), 0, 500*time.Millisecond, corev1.ConditionFalse)
	ready(c.Pod("worker-2", "kube-system", "agent-a", "DaemonSet/agent"), 0, 100*time.Millisecond, corev1.ConditionTrue)

	assert.Equal(t, 1550*time.Millisecond, c.Workloads(t).KubeProxyPodReady, "(1.8s + 1.3s) / 2")

	assert.Zero(t, discoverytest.ThreePlusTwo().Workloads(t).KubeProxyPodReady, "no kube-proxy pod shows it")
}
