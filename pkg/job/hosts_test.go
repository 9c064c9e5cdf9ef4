package job

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

func hostNode(name string, unschedulable, ichors bool, taints ...corev1.Taint) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: unschedulable, Taints: taints}}
	if ichors {
		n.Annotations = map[string]string{kube.CordonedAnnotation: "2026-11-30T16:00:00Z"}
	}

	return n
}

func TestRunnerHosts(t *testing.T) {
	cp := corev1.Taint{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}
	gpu := corev1.Taint{Key: "nvidia.com/gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	soft := corev1.Taint{Key: "spot", Effect: corev1.TaintEffectPreferNoSchedule}
	notReady := corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute}
	cordon := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}

	for _, tc := range []struct {
		name  string
		nodes []corev1.Node
		hosts []string
		stays bool
	}{
		{"one control plane", []corev1.Node{hostNode("cp-1", false, false, cp)}, []string{"cp-1"}, true},
		{"one control plane cordoned by ichor (a resume)", []corev1.Node{hostNode("cp-1", true, true, cp, cordon)}, []string{"cp-1"}, true},
		{"three control planes", []corev1.Node{hostNode("cp-1", false, false, cp), hostNode("cp-2", false, false, cp, notReady), hostNode("cp-3", false, false, cp)},
			[]string{"cp-1", "cp-2", "cp-3"}, false},
		{"the other node cordoned by someone else", []corev1.Node{hostNode("cp-1", false, false, cp), hostNode("w-1", true, false, cordon)}, []string{"cp-1"}, true},
		{"the other node tainted", []corev1.Node{hostNode("cp-1", false, false, cp), hostNode("w-1", false, false, gpu, soft)}, []string{"cp-1"}, true},
		{"a worker with a soft taint", []corev1.Node{hostNode("cp-1", false, false, cp), hostNode("w-1", false, false, soft)}, []string{"cp-1", "w-1"}, false},
		{"no node", nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.hosts, RunnerHosts(tc.nodes))
			assert.Equal(t, tc.stays, StaysOnNode(tc.nodes))
		})
	}
}

func TestJobStayOnNode(t *testing.T) {
	tolerates := func(j *corev1.PodSpec) bool {
		for _, tol := range j.Tolerations {
			if tol.ToleratesTaint(klog.Background(), &corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}, false) {
				return true
			}
		}

		return false
	}
	env := func(j *corev1.PodSpec) string {
		for _, e := range j.Containers[0].Env {
			if e.Name == StayOnNodeEnv {
				return e.Value
			}
		}

		return ""
	}

	p := JobParams{Namespace: "ichor-system", Operation: "op", Attempt: 1, Image: "img", Credentials: api.CredentialsServiceAccount}
	moves := Job(p).Spec.Template.Spec
	assert.False(t, tolerates(&moves), "a runner that can move does not tolerate the cordon")
	assert.Empty(t, env(&moves))

	p.StayOnNode = true
	stays := Job(p).Spec.Template.Spec
	assert.True(t, tolerates(&stays))
	assert.Equal(t, "true", env(&stays))
}
