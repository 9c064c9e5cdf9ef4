package engine

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

func apiResources() []*metav1.APIResourceList {
	return []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "pods", Namespaced: true, Kind: "Pod"},
			{Name: "pods/eviction", Namespaced: true, Kind: "Eviction", Group: "policy", Version: "v1"},
			{Name: "serviceaccounts", Namespaced: true, Kind: "ServiceAccount"},
			{Name: "configmaps", Namespaced: true, Kind: "ConfigMap"},
			{Name: "nodes", Kind: "Node"},
		}},
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{
			{Name: "daemonsets", Namespaced: true, Kind: "DaemonSet"},
		}},
		{GroupVersion: "rbac.authorization.k8s.io/v1", APIResources: []metav1.APIResource{
			{Name: "clusterrolebindings", Kind: "ClusterRoleBinding"},
		}},
	}
}

func (f *fakeCluster) nodeObject(m *fakeMachine, kubelet string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: m.name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: m.ip}},
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: kubelet, OSImage: fmt.Sprintf("Talos (%s)", m.talos)},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}

	if m.controlPlane {
		n.Labels[discovery.ControlPlaneLabel] = ""
	}

	return n
}

func mirrorPod(node string, c discovery.Component, version string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: fmt.Sprintf("%s-%s", c, node),
			Labels:      map[string]string{discovery.ComponentLabel: string(c), "tier": "control-plane"},
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x", discovery.ConfigVersionAnnotation: "1"},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: string(c), Image: "registry.k8s.io/" + string(c) + ":" + version}}},
		Status: readyStatus(true),
	}
}

func kubeProxyPod(node, version string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: "kube-proxy-" + node,
			Labels: map[string]string{discovery.ComponentLabel: "kube-proxy"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: "kube-proxy", Controller: new(true),
			}},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:" + version}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: readyStatus(true).Conditions},
	}
}

func workloadPod(node string, i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: fmt.Sprintf("web-%s-%d", node, i), Labels: map[string]string{"app": "web"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", Controller: new(true)}},
		},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "web", Image: "nginx"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func kubeProxyDaemonSet(version string, n int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy", Generation: 1},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:" + version}},
		}}},
		Status: appsv1.DaemonSetStatus{
			ObservedGeneration: 1, DesiredNumberScheduled: n, UpdatedNumberScheduled: n, NumberAvailable: n, NumberReady: n,
		},
	}
}

func readyStatus(ready bool) corev1.PodStatus {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}

	return corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}}
}
