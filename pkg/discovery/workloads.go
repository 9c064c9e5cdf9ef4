package discovery

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WorkloadsPageSize is how many pods one list request returns: a cluster of
// any size is read in pages, never in one response that must fit in memory
// twice (kubectl drain's own chunk size).
const WorkloadsPageSize = 500

// Workloads are the pods and DaemonSets a drain preview needs.
type Workloads struct {
	// Pods are every pod bound to a node, reduced to what a drain's rules
	// read: metadata (without managed fields), the volumes, the scheduling
	// constraints and the phase.
	Pods []corev1.Pod
	// DaemonSets are every DaemonSet, by namespace/name: a drain leaves their
	// pods, and refuses a pod whose DaemonSet is gone.
	DaemonSets map[string]bool
}

// Workloads lists every pod (in pages of WorkloadsPageSize) and every
// DaemonSet (in pages too). A cluster of n pods costs n/500 + 1 requests
// or so, whatever its node count.
func (d *Discoverer) Workloads(ctx context.Context) (*Workloads, error) {
	w := &Workloads{DaemonSets: map[string]bool{}}

	opts := metav1.ListOptions{Limit: WorkloadsPageSize}

	for {
		list, err := d.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return nil, kubeError(d.Endpoint, "list", "pods", "", err)
		}

		for i := range list.Items {
			if list.Items[i].Spec.NodeName != "" {
				w.Pods = append(w.Pods, reducedPod(&list.Items[i]))
			}
		}

		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}

	opts = metav1.ListOptions{Limit: WorkloadsPageSize}

	for {
		list, err := d.Kube.AppsV1().DaemonSets(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return nil, kubeError(d.Endpoint, "list", "daemonsets.apps", "", err)
		}

		for _, ds := range list.Items {
			w.DaemonSets[ds.Namespace+"/"+ds.Name] = true
		}

		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}

	return w, nil
}

// reducedPod keeps what the drain rules read; a 1000-node cluster's pods
// are held at a fraction of their full size.
func reducedPod(p *corev1.Pod) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         p.Namespace,
			Name:              p.Name,
			UID:               p.UID,
			Labels:            p.Labels,
			Annotations:       mirrorOnly(p.Annotations),
			OwnerReferences:   p.OwnerReferences,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{
			NodeName:     p.Spec.NodeName,
			NodeSelector: p.Spec.NodeSelector,
			Affinity:     p.Spec.Affinity,
			Tolerations:  p.Spec.Tolerations,
			Volumes:      p.Spec.Volumes,
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
}

// mirrorOnly keeps the one annotation a drain reads: the mirror pod's.
func mirrorOnly(annotations map[string]string) map[string]string {
	if v, ok := annotations[corev1.MirrorPodAnnotationKey]; ok {
		return map[string]string{corev1.MirrorPodAnnotationKey: v}
	}

	return nil
}
