package kubelet

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestVersionOf(t *testing.T) {
	for image, want := range map[string]string{
		"registry.k8s.io/kube-apiserver:v1.36.3":                 "v1.36.3",
		"registry.example.com:5000/k8s/kube-apiserver:v1.36.3":   "v1.36.3",
		"registry.example.com:5000/k8s/kube-apiserver":           "",
		"ghcr.io/siderolabs/kubelet:v1.36.3@sha256:0123456789ab": "v1.36.3",
	} {
		require.Equal(t, want, VersionOf(image), image)
	}
}

func TestImageRoot(t *testing.T) {
	k := &Kubelets{opts: Options{Images: map[string]string{"ghcr.io/ichor-dev/kubectl-ichor": "/root"}}}
	for image, want := range map[string]bool{
		"ghcr.io/ichor-dev/kubectl-ichor:v0.1.0":       true,
		"ghcr.io/ichor-dev/kubectl-ichor@sha256:abc":   true,
		"ghcr.io/ichor-dev/kubectl-ichor-other:v0.1.0": false,
		"registry.k8s.io/kube-proxy:v1.36.3":           false,
	} {
		_, ok := k.imageRoot(image)
		require.Equal(t, want, ok, image)
	}
}

func TestSecurityOf(t *testing.T) {
	u, g := int64(1000), int64(2000)
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsUser: &u}}}
	uid, gid, ro := securityOf(pod, corev1.Container{})
	require.Equal(t, int64(1000), *uid)
	require.Equal(t, int64(1000), *gid, "the group defaults to the user")
	require.False(t, ro)

	yes := true
	uid, gid, ro = securityOf(pod, corev1.Container{SecurityContext: &corev1.SecurityContext{RunAsGroup: &g, ReadOnlyRootFilesystem: &yes}})
	require.Equal(t, int64(1000), *uid)
	require.Equal(t, int64(2000), *gid)
	require.True(t, ro)

	uid, gid, _ = securityOf(&corev1.Pod{}, corev1.Container{})
	require.Nil(t, uid)
	require.Nil(t, gid)
}

func TestFieldValue(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{NodeName: "cp-1", ServiceAccountName: "sa"}}
	for path, want := range map[string]string{
		"metadata.name": "p", "metadata.namespace": "ns", "metadata.uid": "u", "spec.nodeName": "cp-1",
		"spec.serviceAccountName": "sa", "status.podIP": "10.0.0.1", "metadata.labels['app']": "x",
	} {
		got, err := fieldValue(pod, path, "10.0.0.1")
		require.NoError(t, err)
		require.Equal(t, want, got, path)
	}
	_, err := fieldValue(pod, "status.phase", "")
	require.ErrorContains(t, err, "not supported by the simulator")
}

func TestRunningStatusKeepsWhatOthersSet(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "0123456789"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{QOSClass: corev1.PodQOSBurstable, Conditions: []corev1.PodCondition{
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue},
		}},
	}
	st := runningStatus(pod, "127.0.0.1", "10.1.1.1", true, true)
	require.Equal(t, corev1.PodQOSBurstable, st.QOSClass, "the QoS class is immutable")
	require.Equal(t, corev1.PodRunning, st.Phase)
	require.True(t, st.ContainerStatuses[0].Ready)
	require.Len(t, preservedConditions(pod), 1, "the eviction's DisruptionTarget is kept")
}

func TestHostsFileListsEveryAddress(t *testing.T) {
	r := &podRunner{k: &Kubelets{opts: Options{Hosts: map[string][]string{
		"talos.default":          {"127.1.0.10", "127.1.0.11"},
		"kubernetes.default.svc": {"127.1.0.1"},
	}}}, n: &node{podIPs: map[string]string{"u": "10.1.1.1"}}, uid: "u"}
	got := r.hostsFile(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{}})
	require.Contains(t, got, "127.1.0.1\tkubernetes.default.svc\n")
	require.Contains(t, got, "127.1.0.10\ttalos.default\n127.1.0.11\ttalos.default\n")
	require.Contains(t, got, "10.1.1.1\tp\n")
}
