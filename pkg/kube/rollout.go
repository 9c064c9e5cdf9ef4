package kube

import (
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// BlockedNode is a NotReady node whose DaemonSet pod is not Ready: the pod cannot become
// Ready before the node does, so it holds one of the rolling update's unavailable slots
// (maxUnavailable) for as long.
type BlockedNode struct {
	// Node is the node's name; Why its NotReady reason (" (reason: message)" or "").
	Node, Why string
	// Pods are the DaemonSet's pods on it, by name.
	Pods []string
}

// RolloutBlock says why a DaemonSet's rollout cannot progress (see DaemonSetBlocked).
type RolloutBlock struct {
	// Blocked are the NotReady nodes whose pod holds an unavailable slot, by name.
	Blocked []BlockedNode
	// MaxUnavailable is how many pods the rolling update replaces at once.
	MaxUnavailable int
	// Updated and Desired are the DaemonSet's status counts.
	Updated, Desired int32
	// Waiting are the Ready nodes whose pod is not yet on the target and Ready: work the
	// rollout could still do, had it a slot.
	Waiting int
}

// String says it in one line, naming the nodes.
func (b RolloutBlock) String() string {
	nodes := make([]string, 0, len(b.Blocked))
	for _, n := range b.Blocked {
		nodes = append(nodes, fmt.Sprintf("%s is NotReady%s and its pod %s is not Ready", n.Node, n.Why, strings.Join(n.Pods, ", ")))
	}

	slots := fmt.Sprintf("they take %d of the DaemonSet's %d unavailable slot(s) (maxUnavailable)", len(b.Blocked), b.MaxUnavailable)
	if len(b.Blocked) == 1 {
		slots = fmt.Sprintf("it takes 1 of the DaemonSet's %d unavailable slot(s) (maxUnavailable)", b.MaxUnavailable)
	}

	var outcome string

	switch {
	case b.Waiting > 0:
		outcome = fmt.Sprintf("no pod of the %d Ready node(s) left can be replaced", b.Waiting)
	default:
		outcome = "every other node is done, and the rollout cannot finish while they are NotReady"
	}

	return fmt.Sprintf("%s: %s, so %s (%d of %d pods updated)", strings.Join(nodes, "; "), slots, outcome, b.Updated, b.Desired)
}

// DaemonSetBlocked judges, from the DaemonSet ds (its container's image to reach tag),
// its pods and the nodes they run on, whether its rolling update can still progress.
// It cannot when NotReady nodes hold its pods not Ready (each such pod takes one of the
// maxUnavailable slots, and the DaemonSet controller replaces no other pod while none is
// free) and either they take every slot, or they are all the rollout has left to do.
// It returns the block and true then; false while the rollout is done, its status not
// yet observed, or it may move.
func DaemonSetBlocked(ds *appsv1.DaemonSet, container, tag string, pods []*corev1.Pod, node func(string) (*corev1.Node, bool)) (RolloutBlock, bool) {
	if done, _ := DaemonSetRollout(ds, container, tag); done || ds.Generation > ds.Status.ObservedGeneration {
		return RolloutBlock{}, false
	}

	b := RolloutBlock{MaxUnavailable: discovery.DaemonSetMaxUnavailable(ds), Updated: ds.Status.UpdatedNumberScheduled, Desired: ds.Status.DesiredNumberScheduled}

	byNode := map[string][]*corev1.Pod{}

	for _, p := range pods {
		if p.Spec.NodeName != "" {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}

	names := make([]string, 0, len(byNode))
	for name := range byNode {
		names = append(names, name)
	}

	sort.Strings(names)

	for _, name := range names {
		onNode := byNode[name]
		n, ok := node(name)
		ready := false
		why := ""

		if ok {
			ready, why = NodeReady(n)
		}

		switch {
		case !ok:
			// A Node gone: the pod goes with it (pod GC), freeing its slot.
		case !ready && !anyPodReady(onNode):
			blocked := BlockedNode{Node: name, Why: why}
			for _, p := range onNode {
				blocked.Pods = append(blocked.Pods, p.Name)
			}

			sort.Strings(blocked.Pods)
			b.Blocked = append(b.Blocked, blocked)
		case ready && !podAtTag(onNode, container, tag):
			b.Waiting++
		}
	}

	if len(b.Blocked) == 0 || (len(b.Blocked) < b.MaxUnavailable && b.Waiting > 0) {
		return b, false
	}

	return b, true
}

// anyPodReady reports whether a pod of pods, not being deleted, is Ready.
func anyPodReady(pods []*corev1.Pod) bool {
	for _, p := range pods {
		if p.DeletionTimestamp == nil && podReady(p) {
			return true
		}
	}

	return false
}

// podAtTag reports whether a pod of pods, not being deleted, runs container on tag and is
// Ready.
func podAtTag(pods []*corev1.Pod, container, tag string) bool {
	for _, p := range pods {
		if p.DeletionTimestamp == nil && podReady(p) && render.TagOf(ContainerImage(p.Spec, container)) == tag {
			return true
		}
	}

	return false
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}

	return false
}

// DaemonSetPods returns the pods of the DaemonSet name in kube-system (its k8s-app label,
// which the Cache watches for kube-proxy), by name.
func (c *Cache) DaemonSetPods(name string) []*corev1.Pod {
	pods, err := c.pods.Pods(discovery.StaticPodNamespace).List(labels.SelectorFromSet(labels.Set{discovery.ComponentLabel: name}))
	if err != nil {
		return nil
	}

	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })

	return pods
}
