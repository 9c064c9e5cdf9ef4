package talosnode

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

const (
	// manifestDir is where kubeadm writes the static pod manifests the
	// kubelet runs.
	manifestDir = "/etc/kubernetes/manifests"
	// versionsDir holds each Kubernetes version's binaries in the node
	// image (hack/kind-image.sh).
	versionsDir = "/kind/k8s"
	// resyncInterval bounds how long a change goes unnoticed.
	resyncInterval = 2 * time.Second
	// execTimeout bounds one docker exec.
	execTimeout = 2 * time.Minute
)

// node drives one kind node from its Talos machine: what the machine's
// active config says runs there is made to run there, and what the real
// kubelet and Node show is shown to the machine, as Talos learns it.
type node struct {
	m      *machine.Machine
	name   string // the container's and the Kubernetes node's name
	client kubernetes.Interface
	log    *slog.Logger

	kubelet string                       // the version /usr/bin/kubelet runs
	pods    map[string]machine.StaticPod // the static pods written, by component
	talos   string                       // the Talos version os-release names
}

// newNode drives the node of m, whose os-release names Talos talos and whose
// kubelet runs Kubernetes kubelet.
func newNode(m *machine.Machine, client kubernetes.Interface, talos, kubelet string, log *slog.Logger) *node {
	return &node{
		m: m, name: m.Name(), client: client, log: log.With("node", m.Name()),
		pods: map[string]machine.StaticPod{}, talos: talos, kubelet: kubelet,
	}
}

// run follows the machine until ctx ends.
func (n *node) run(ctx context.Context) {
	changes, cancel := n.m.Subscribe()
	defer cancel()
	tick := time.NewTicker(resyncInterval)
	defer tick.Stop()
	for {
		if err := n.sync(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("sync the node with its machine", "err", err)
		}
		n.observe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-changes:
		case <-tick.C:
		}
	}
}

// sync makes the node run what its machine's active config says: each
// static pod's image, the kubelet's version.
func (n *node) sync(ctx context.Context) error {
	st := n.m.State()
	if !st.Up {
		return nil
	}
	if st.TalosVersion != n.talos {
		// A boot into another version: the kubelet reports it in osImage.
		n.log.Info("booted another Talos", "from", n.talos, "to", st.TalosVersion)
		if err := writeOSRelease(ctx, n.name, st.TalosVersion); err != nil {
			return err
		}
		n.talos = st.TalosVersion
	}
	for component, want := range st.StaticPods {
		if n.pods[component] == want {
			continue
		}
		if err := n.writeStaticPod(ctx, component, want); err != nil {
			return err
		}
		n.pods[component] = want
	}
	version := imageTag(st.KubeletImage)
	if version == "" || version == n.kubelet {
		return nil
	}
	n.log.Info("switching the kubelet", "from", n.kubelet, "to", version)
	bin := versionsDir + "/" + version + "/kubelet"
	if _, err := n.exec(ctx, nil, "sh", "-euc", `test -x "$1" || { echo "the node image has no $1: build one with this version in KIND_K8S_VERSIONS (make kind-image)" >&2; exit 1; }
ln -sf "$1" /usr/bin/kubelet
systemctl restart kubelet`, "-", bin); err != nil {
		return fmt.Errorf("kubelet %s: %w", version, err)
	}
	n.kubelet = version
	return nil
}

// writeStaticPod rewrites a control-plane component's static pod manifest
// with the machine's image, labelled and annotated as Talos' static pods
// are (k8s-app, tier, talos.dev/config-version). The kubelet restarts the
// pod on the change.
func (n *node) writeStaticPod(ctx context.Context, component string, want machine.StaticPod) error {
	path := manifestDir + "/" + component + ".yaml"
	raw, err := n.exec(ctx, nil, "cat", path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var pod map[string]any
	if err := yaml.Unmarshal(raw, &pod); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	u := unstructured.Unstructured{Object: pod}
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels["k8s-app"], labels["tier"] = component, "control-plane"
	u.SetLabels(labels)
	annotations := u.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations["talos.dev/config-version"] = want.ConfigVersion
	u.SetAnnotations(annotations)
	containers, _, _ := unstructured.NestedSlice(pod, "spec", "containers")
	if len(containers) == 0 {
		return fmt.Errorf("%s has no container", path)
	}
	c := containers[0].(map[string]any)
	old, _ := c["image"].(string)
	c["image"] = want.Image
	if err := unstructured.SetNestedSlice(pod, containers, "spec", "containers"); err != nil {
		return err
	}
	out, err := yaml.Marshal(pod)
	if err != nil {
		return err
	}
	if bytes.Equal(out, raw) {
		return nil
	}
	// Written beside the directory, then moved in: the kubelet never reads
	// half a manifest.
	tmp := "/etc/kubernetes/." + component + ".yaml"
	if _, err := n.exec(ctx, out, "sh", "-euc", `cat > "$1" && mv "$1" "$2"`, "-", tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	n.log.Info("static pod written", "component", component, "from", old, "to", want.Image, "configVersion", want.ConfigVersion)
	return nil
}

// observe shows the machine the Node's Ready condition and unschedulable
// flag and its static pods' statuses, as Talos learns them from its kubelet
// and the Kubernetes API.
func (n *node) observe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kn, err := n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
	if err != nil {
		return
	}
	v := machine.KubeletView{Unschedulable: kn.Spec.Unschedulable, StaticPods: map[string]map[string]any{}}
	for _, c := range kn.Status.Conditions {
		if c.Type == corev1.NodeReady {
			v.NodeReady = c.Status == corev1.ConditionTrue
		}
	}
	if n.m.ControlPlane() {
		pods, err := n.client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", n.name).String(),
		})
		if err != nil {
			return
		}
		for _, p := range pods.Items {
			if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; !mirror {
				continue
			}
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&p.Status)
			if err != nil {
				continue
			}
			v.StaticPods[p.Namespace+"/"+p.Name] = obj
		}
	}
	n.m.ObserveKubelet(v)
}

// writeOSRelease names Talos version in the node's /etc/os-release and
// restarts the kubelet, which reads it when it starts (the Node's osImage).
func writeOSRelease(ctx context.Context, node, version string) error {
	_, err := Exec(ctx, node, nil, "sh", "-euc", `rm -f /etc/os-release
printf 'NAME="Talos"\nID=talos\nVERSION_ID=%s\nPRETTY_NAME="Talos (%s)"\n' "$1" "$1" > /etc/os-release
systemctl restart kubelet`, "-", version)
	return err
}

// exec runs a command in the node's container, stdin from in (nil: none).
func (n *node) exec(ctx context.Context, in []byte, args ...string) ([]byte, error) {
	return Exec(ctx, n.name, in, args...)
}

// Exec runs a command in a node's container, stdin from in (nil: none), and
// returns its standard output.
func Exec(ctx context.Context, container string, in []byte, args ...string) ([]byte, error) {
	flags := []string{"exec"}
	if in != nil {
		flags = append(flags, "-i")
	}
	return docker(ctx, in, append(append(flags, container), args...)...)
}

// docker runs a docker command (bounded by execTimeout), stdin from in (nil:
// none), and returns its standard output; its error carries the standard
// error.
func docker(ctx context.Context, in []byte, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	if in != nil {
		cmd.Stdin = bytes.NewReader(in)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// imageTag is the tag of an image reference ("" if none).
func imageTag(ref string) string {
	if i := strings.LastIndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	i := strings.LastIndexByte(ref, ':')
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ""
	}
	return ref[i+1:]
}
