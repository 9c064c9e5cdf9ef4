package kube

import (
	"context"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// PodVerdict is what a drain would do with one pod.
type PodVerdict struct {
	// Pod is the pod judged.
	Pod *corev1.Pod
	// Evict is true when the drain evicts it (false: it stays, as a
	// DaemonSet's or a mirror pod does, or the drain refuses it).
	Evict bool
	// Refusal is kubectl drain's error when the drain refuses the node
	// because of this pod (no controller, its DaemonSet gone).
	Refusal string
	// Warning is kubectl drain's warning for a pod it evicts anyway: its
	// emptyDir data is deleted.
	Warning string
}

// PreviewDrain says what Drainer.Drain would do with each of pods, by the
// very rules the drain runs (kubectl's drain helper, set as drainRules
// sets it), without a request: the helper reads the pods and DaemonSets
// given here instead of the cluster. daemonSets holds every DaemonSet as
// namespace/name.
func PreviewDrain(ctx context.Context, pods []corev1.Pod, daemonSets map[string]bool) []PodVerdict {
	client := &previewClient{daemonSets: daemonSets}
	h := drainRules(ctx, client)

	out := make([]PodVerdict, 0, len(pods))

	for i := range pods {
		client.pod = &pods[i]
		v := PodVerdict{Pod: &pods[i]}

		list, errs := h.GetPodsForDeletion(pods[i].Spec.NodeName)

		switch {
		case len(errs) > 0:
			v.Refusal = joinErrors(errs)
		case list != nil:
			v.Evict = len(list.Pods()) == 1
			v.Warning = strings.TrimSpace(list.Warnings())
		}

		// The helper keeps only its last filter's message: a pod with a
		// controller loses the local storage warning its data deserves.
		if v.Evict && v.Warning == "" && hasEmptyDir(&pods[i]) {
			v.Warning = "deleting Pods with local storage: " + pods[i].Namespace + "/" + pods[i].Name
		}

		out = append(out, v)
	}

	return out
}

// hasEmptyDir is the drain's rule for local storage: an emptyDir volume.
func hasEmptyDir(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil {
			return true
		}
	}

	return false
}

// previewClient serves a drain helper one pod and the DaemonSets known; it
// answers only the two calls the helper's GetPodsForDeletion makes.
type previewClient struct {
	kubernetes.Interface

	pod        *corev1.Pod
	daemonSets map[string]bool
}

func (c *previewClient) CoreV1() corev1client.CoreV1Interface { return previewCore{c: c} }
func (c *previewClient) AppsV1() appsv1client.AppsV1Interface { return previewApps{c: c} }

type previewCore struct {
	corev1client.CoreV1Interface

	c *previewClient
}

func (p previewCore) Pods(string) corev1client.PodInterface { return previewPods{c: p.c} }

type previewPods struct {
	corev1client.PodInterface

	c *previewClient
}

func (p previewPods) List(context.Context, metav1.ListOptions) (*corev1.PodList, error) {
	return &corev1.PodList{Items: []corev1.Pod{*p.c.pod}}, nil
}

type previewApps struct {
	appsv1client.AppsV1Interface

	c *previewClient
}

func (p previewApps) DaemonSets(namespace string) appsv1client.DaemonSetInterface {
	return previewDaemonSets{c: p.c, namespace: namespace}
}

type previewDaemonSets struct {
	appsv1client.DaemonSetInterface

	c         *previewClient
	namespace string
}

func (p previewDaemonSets) Get(_ context.Context, name string, _ metav1.GetOptions) (*appsv1.DaemonSet, error) {
	if !p.c.daemonSets[p.namespace+"/"+name] {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, name)
	}

	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: p.namespace, Name: name}}, nil
}
