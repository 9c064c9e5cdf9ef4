package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestDaemonSetBlocked judges whether kube-proxy's rollout can still progress, from the
// DaemonSet's status and its pods: a pod not Ready on a NotReady node holds one of the
// maxUnavailable slots for as long as the node is down.
func TestDaemonSetBlocked(t *testing.T) {
	const old, target = "registry.k8s.io/kube-proxy:v1.35.4", "registry.k8s.io/kube-proxy:v1.36.3"

	ds := func(maxUnavailable int, updated, desired int32) *appsv1.DaemonSet {
		mu := intstr.FromInt32(int32(maxUnavailable))
		d := &appsv1.DaemonSet{}
		d.Name, d.Generation = "kube-proxy", 2
		d.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &mu}
		d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "kube-proxy", Image: target}}
		d.Status = appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberAvailable: updated}

		return d
	}
	pod := func(name, node, image string, ready bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "kube-proxy", Image: image}}}}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}

		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}

		return p
	}
	nodes := func(notReady ...string) func(string) (*corev1.Node, bool) {
		return func(name string) (*corev1.Node, bool) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			status := corev1.ConditionTrue

			for _, d := range notReady {
				if d == name {
					status = corev1.ConditionUnknown
				}
			}

			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status."}}

			return n, name != "gone"
		}
	}

	for _, tc := range []struct {
		name    string
		ds      *appsv1.DaemonSet
		pods    []*corev1.Pod
		nodes   func(string) (*corev1.Node, bool)
		stuck   bool
		blocked []string
	}{
		{
			name: "a held NotReady node takes the only slot: nothing else moves",
			ds:   ds(1, 1, 4),
			pods: []*corev1.Pod{
				pod("kp-a", "cp-1", old, true), pod("kp-b", "worker-1", old, true), pod("kp-c", "worker-2", target, false), pod("kp-d", "cp-2", target, true),
			},
			nodes: nodes("worker-2"), stuck: true, blocked: []string{"worker-2"},
		},
		{
			name:  "its old pod, never replaced, counts the same",
			ds:    ds(1, 0, 3),
			pods:  []*corev1.Pod{pod("kp-a", "cp-1", old, true), pod("kp-b", "worker-1", old, true), pod("kp-c", "worker-2", old, false)},
			nodes: nodes("worker-2"), stuck: true, blocked: []string{"worker-2"},
		},
		{
			name:  "a slot left: the rollout moves",
			ds:    ds(2, 1, 4),
			pods:  []*corev1.Pod{pod("kp-a", "cp-1", old, true), pod("kp-b", "worker-1", target, true), pod("kp-c", "worker-2", target, false), pod("kp-d", "cp-2", old, true)},
			nodes: nodes("worker-2"),
		},
		{
			name: "a slot left, but the NotReady node is all that is left",
			ds: func() *appsv1.DaemonSet {
				d := ds(2, 3, 3)
				d.Status.NumberAvailable = 2

				return d
			}(),
			pods:  []*corev1.Pod{pod("kp-a", "cp-1", target, true), pod("kp-b", "worker-1", target, true), pod("kp-c", "worker-2", target, false)},
			nodes: nodes("worker-2"), stuck: true, blocked: []string{"worker-2"},
		},
		{
			name:  "a pod not Ready on a Ready node is a rollout under way",
			ds:    ds(1, 1, 3),
			pods:  []*corev1.Pod{pod("kp-a", "cp-1", target, false), pod("kp-b", "worker-1", old, true), pod("kp-c", "worker-2", old, true)},
			nodes: nodes(),
		},
		{
			name:  "a NotReady node whose pod is still Ready holds no slot yet",
			ds:    ds(1, 1, 3),
			pods:  []*corev1.Pod{pod("kp-a", "cp-1", target, false), pod("kp-b", "worker-1", old, true), pod("kp-c", "worker-2", old, true)},
			nodes: nodes("worker-2"),
		},
		{
			name:  "a deleted Node frees its slot",
			ds:    ds(1, 1, 3),
			pods:  []*corev1.Pod{pod("kp-a", "cp-1", target, true), pod("kp-b", "worker-1", old, true), pod("kp-c", "gone", target, false)},
			nodes: nodes("gone"),
		},
		{
			name:  "rolled out",
			ds:    ds(1, 3, 3),
			pods:  []*corev1.Pod{pod("kp-a", "cp-1", target, true), pod("kp-b", "worker-1", target, true), pod("kp-c", "worker-2", target, true)},
			nodes: nodes(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, stuck := DaemonSetBlocked(tc.ds, "kube-proxy", "v1.36.3", tc.pods, tc.nodes)
			assert.Equal(t, tc.stuck, stuck)

			if !tc.stuck {
				return
			}

			var names []string
			for _, n := range b.Blocked {
				names = append(names, n.Node)
			}

			assert.Equal(t, tc.blocked, names)
		})
	}

	t.Run("the message names the node, its pod and the slot", func(t *testing.T) {
		b, stuck := DaemonSetBlocked(ds(1, 1, 3), "kube-proxy", "v1.36.3",
			[]*corev1.Pod{pod("kp-a", "cp-1", target, true), pod("kp-b", "worker-1", old, true), pod("kp-c", "worker-2", target, false)}, nodes("worker-2"))
		assert.True(t, stuck)
		assert.Equal(t, "worker-2 is NotReady (NodeStatusUnknown: Kubelet stopped posting node status.) and its pod kp-c is not Ready: "+
			"it takes 1 of the DaemonSet's 1 unavailable slot(s) (maxUnavailable), so no pod of the 1 Ready node(s) left can be replaced (1 of 3 pods updated)", b.String())
	})
}
