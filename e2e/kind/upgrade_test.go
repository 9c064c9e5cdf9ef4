package kind

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/mod/semver"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kind/pkg/cluster/nodeutils"
)

// root is the repository's root (the tests run in e2e/kind).
var root = func() string { r, _ := filepath.Abs("../.."); return r }()

// pluginPath is the plugin the tests run (ICHOR_PLUGIN, default make
// build's).
func pluginPath() string {
	if p := os.Getenv("ICHOR_PLUGIN"); p != "" {
		return p
	}
	return filepath.Join(root, "_output/bin/kubectl-ichor")
}

var jobImage struct {
	once sync.Once
	ref  string
	err  error
}

// loadJobImage loads the Job's image (make image's OCI tarball, or
// ICHOR_JOB_IMAGE_TAR) into every node, as kind load image-archive does,
// and returns its reference.
func loadJobImage(t *testing.T) string {
	t.Helper()
	jobImage.once.Do(func() {
		path := os.Getenv("ICHOR_JOB_IMAGE_TAR")
		if path == "" {
			path = filepath.Join(root, "_output/image/kubectl-ichor.tar")
		}
		if jobImage.ref, jobImage.err = imageRef(path); jobImage.err != nil {
			return
		}
		nodes, err := env.provider.ListInternalNodes(env.name)
		if err != nil {
			jobImage.err = err
			return
		}
		for _, n := range nodes {
			f, err := os.Open(path)
			if err != nil {
				jobImage.err = err
				return
			}
			err = nodeutils.LoadImageArchive(n, f)
			f.Close()
			if err != nil {
				jobImage.err = fmt.Errorf("load %s into %s: %w", path, n.String(), err)
				return
			}
		}
	})
	if jobImage.err != nil {
		t.Fatalf("the Job's image: %v (run make image)", jobImage.err)
	}
	return jobImage.ref
}

// imageRef is the reference a docker-loadable image tarball is tagged with.
func imageRef(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("%s has no manifest.json", path)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			return "", fmt.Errorf("%s: manifest.json: %w", path, err)
		}
		if len(m) == 0 || len(m[0].RepoTags) == 0 {
			return "", fmt.Errorf("%s: manifest.json names no tag", path)
		}
		return m[0].RepoTags[0], nil
	}
}

// ichor runs the plugin against the kind cluster, its output in the test
// log and in the artifacts.
func ichor(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args = append(args, "--kubeconfig", env.kubeconfig, "--talosconfig", env.talosconfig)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, pluginPath(), args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("kubectl ichor %s (%s, %v):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Second), err, out.String())
	name := strings.ReplaceAll(t.Name(), "/", "_") + "-" + strings.Join(args[:min(2, len(args))], "-") + ".log"
	_ = os.WriteFile(filepath.Join(env.artifacts, name), out.Bytes(), 0o644)
	return out.String(), err
}

const webCorefile = `.:5353 {
    health :8080
    ready :8181
    errors
}
`

// deployWeb starts the workload the upgrade must keep serving: 3 replicas
// (CoreDNS' image answering whoami, the image every node has) behind a
// Service, at most one of them disrupted at a time (a PodDisruptionBudget).
func deployWeb(t *testing.T, ctx context.Context) {
	t.Helper()
	const ns = "web"
	c := env.client
	if _, err := c.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{}); err == nil {
		return // an earlier test's
	}
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Data:       map[string]string{"Corefile": webCorefile},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	replicas := int32(3)
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
							Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{
								LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
								TopologyKey:   corev1.LabelHostname,
							},
						}},
					}},
					Containers: []corev1.Container{{
						Name:  "web",
						Image: env.coreDNSImage,
						Args:  []string{"-conf", "/etc/web/Corefile"},
						Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
							PeriodSeconds: 2,
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/web"}},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web"}},
					}}},
				},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolUDP}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	maxUnavailable := intstr.FromInt32(1)
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &maxUnavailable, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, func() error {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas != replicas {
			return fmt.Errorf("web: %d of %d replicas ready", d.Status.ReadyReplicas, replicas)
		}
		return nil
	})
}

// watch samples the cluster every half second while an upgrade runs: the
// versions the real components report (each apiserver's /version, each
// kubelet's, the images of the control-plane static pods and of kube-proxy)
// against the invariant that none is newer than an apiserver, the web
// Service's ready endpoints, and the runner pods.
type watch struct {
	mu             sync.Mutex
	violations     []string
	longestNoReady time.Duration
	noReadySince   time.Time
	runners        map[string]string // runner pod -> node
	samples        int
}

func startWatch(ctx context.Context) *watch {
	w := &watch{runners: map[string]string{}}
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			w.sample(ctx)
		}
	}()
	return w
}

func (w *watch) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now := time.Now()
	ready := -1
	if slices, err := env.client.DiscoveryV1().EndpointSlices("web").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"}); err == nil {
		ready = 0
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
	}
	versions, err := componentVersions(ctx)
	runners, _ := env.client.CoreV1().Pods("ichor-system").List(ctx, metav1.ListOptions{LabelSelector: "ichor.dev/operation"})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	switch {
	case ready == 0 && w.noReadySince.IsZero():
		w.noReadySince = now
	case ready > 0 && !w.noReadySince.IsZero():
		w.longestNoReady = max(w.longestNoReady, now.Sub(w.noReadySince))
		w.noReadySince = time.Time{}
	}
	if err == nil {
		if v := versions.violation(); v != "" {
			w.violations = append(w.violations, now.Format(time.TimeOnly)+" "+v)
		}
	}
	if runners != nil {
		for _, p := range runners.Items {
			if _, seen := w.runners[p.Name]; !seen && p.Spec.NodeName != "" {
				w.runners[p.Name] = p.Spec.NodeName
				go keepLogs(p.Namespace, p.Name)
			}
		}
	}
}

// keepLogs copies a runner pod's log into the artifacts as it is written:
// the Job deletes the pods of a run that stopped before the logs are
// collected. A stream served by an apiserver that restarts breaks off; it is
// followed again from the last line's time until the container ended.
func keepLogs(ns, pod string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	f, err := os.Create(filepath.Join(env.artifacts, "runner-"+pod+".log"))
	if err != nil {
		return
	}
	defer f.Close()
	var since *metav1.Time
	seen := map[string]bool{} // the stream again starts at since's second
	for ctx.Err() == nil {
		stream, err := env.client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Follow: true, Timestamps: true, SinceTime: since}).Stream(ctx)
		if err == nil {
			sc := bufio.NewScanner(stream)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				if seen[line] {
					continue
				}
				seen[line] = true
				fmt.Fprintln(f, line)
				if ts, _, ok := strings.Cut(line, " "); ok {
					if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
						since = &metav1.Time{Time: t}
					}
				}
			}
			stream.Close()
		}
		p, err := env.client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)) {
			return
		}
		time.Sleep(time.Second)
	}
}

// versions are what the components report, by "component node".
type versions struct {
	apiservers map[string]string
	others     map[string]string
}

// violation names a component newer than the oldest apiserver that answers.
func (v versions) violation() string {
	oldest := ""
	for _, a := range v.apiservers {
		if oldest == "" || semver.Compare(minor(a), minor(oldest)) < 0 {
			oldest = a
		}
	}
	if oldest == "" {
		return ""
	}
	var bad []string
	for c, o := range v.others {
		if semver.Compare(minor(o), minor(oldest)) > 0 {
			bad = append(bad, fmt.Sprintf("%s %s", c, o))
		}
	}
	if len(bad) == 0 {
		return ""
	}
	slices.Sort(bad)
	return fmt.Sprintf("newer than the oldest apiserver (%s): %s", oldest, strings.Join(bad, ", "))
}

func minor(v string) string { return semver.MajorMinor(v) }

// componentVersions asks each control plane's apiserver for /version (one
// restarting does not answer and is left out) and reads the kubelets'
// versions and the images of the other components' pods.
func componentVersions(ctx context.Context) (versions, error) {
	v := versions{apiservers: map[string]string{}, others: map[string]string{}}
	nodes, err := env.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return v, err
	}
	for _, n := range nodes.Items {
		v.others["kubelet "+n.Name] = n.Status.NodeInfo.KubeletVersion
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
			continue
		}
		if gv, err := apiserverVersion(internalIP(n)); err == nil {
			v.apiservers["kube-apiserver "+n.Name] = gv
		}
	}
	pods, err := env.client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		return v, err
	}
	for _, p := range pods.Items {
		app := p.Labels["k8s-app"]
		if app != "kube-controller-manager" && app != "kube-scheduler" && app != "kube-proxy" {
			continue
		}
		if p.Status.Phase != corev1.PodRunning || len(p.Spec.Containers) == 0 {
			continue
		}
		v.others[app+" "+p.Spec.NodeName] = tag(p.Spec.Containers[0].Image)
	}
	return v, nil
}

func apiserverVersion(ip string) (string, error) {
	cfg := rest.CopyConfig(env.config)
	cfg.Host = "https://" + ip + ":6443"
	cfg.Timeout = 2 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return "", err
	}
	info, err := dc.ServerVersion()
	if err != nil {
		return "", err
	}
	return info.GitVersion, nil
}

func tag(image string) string {
	if i := strings.LastIndexByte(image, ':'); i >= 0 && !strings.Contains(image[i:], "/") {
		return image[i+1:]
	}
	return ""
}

// TestKubernetesUpgrade upgrades the cluster to the newest Kubernetes version
// of the node image through the Job (the real image, on real kubelets), a
// workload of 3 replicas behind a Service and a PodDisruptionBudget running
// throughout, and checks from what the real components report that no
// component was ever newer than an apiserver, that the Service always had a
// ready endpoint, that every node ends on the target and schedulable, and
// that one runner pod did it all: it stayed on its own node through that node's
// drain and kubelet restart (a new kubelet that restarts its containers restarts
// the runner in the same pod).
func TestKubernetesUpgrade(t *testing.T) {
	if len(env.versions) < 2 {
		t.Fatalf("the node image carries only Kubernetes %v: build one with two, e.g. KIND_K8S_VERSIONS=\"v1.35.4 v1.36.3\" make kind-image", env.versions)
	}
	from, to := env.versions[0], env.versions[len(env.versions)-1]
	image := loadJobImage(t)
	ctx := context.Background()
	deployWeb(t, ctx)

	out, err := ichor(t, 5*time.Minute, "plan", "kubernetes", "--to", to)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	for _, want := range []string{"APIServers", "Kubelets"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan: no stage %s in:\n%s", want, out)
		}
	}

	wctx, stop := context.WithCancel(ctx)
	w := startWatch(wctx)
	start := time.Now()
	out, err = ichor(t, 45*time.Minute, "upgrade", "kubernetes", "--to", to, "--yes", "--image", image, "--talos-credentials=local")
	stop()
	if err != nil {
		t.Fatalf("upgrade %s -> %s: %v", from, to, err)
	}
	if !strings.Contains(out, "Succeeded") {
		t.Errorf("upgrade: no Succeeded in its output")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("upgrade %s -> %s in %s; %d samples; longest time the web Service had no ready endpoint: %s; runner pods: %v",
		from, to, time.Since(start).Round(time.Second), w.samples, w.longestNoReady, w.runners)
	for _, v := range w.violations {
		t.Errorf("invariant: %s", v)
	}
	if w.longestNoReady > 0 || !w.noReadySince.IsZero() {
		t.Errorf("the web Service had no ready endpoint for %s", w.longestNoReady)
	}
	if len(w.runners) != 1 {
		t.Errorf("runner pods %v: want one, kept on its own node through its drain and kubelet restart", w.runners)
	}

	final, err := componentVersions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for c, v := range final.apiservers {
		if v != to {
			t.Errorf("%s: %s, want %s", c, v, to)
		}
	}
	if len(final.apiservers) != env.controlPlanes {
		t.Errorf("%d apiservers answer /version, want %d", len(final.apiservers), env.controlPlanes)
	}
	for c, v := range final.others {
		if v != to {
			t.Errorf("%s: %s, want %s", c, v, to)
		}
	}
	nodes, err := env.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable || !ready(n) {
			t.Errorf("node %s: unschedulable %t, ready %t", n.Name, n.Spec.Unschedulable, ready(n))
		}
	}
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		pods, err := env.client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=" + name})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != env.controlPlanes {
			t.Errorf("%d %s mirror pods, want %d", len(pods.Items), name, env.controlPlanes)
		}
		for _, p := range pods.Items {
			if got := tag(p.Spec.Containers[0].Image); got != to {
				t.Errorf("%s runs %s, want %s", p.Name, p.Spec.Containers[0].Image, to)
			}
		}
	}
	ds, err := env.client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := tag(ds.Spec.Template.Spec.Containers[0].Image); got != to || ds.Status.UpdatedNumberScheduled != ds.Status.DesiredNumberScheduled || ds.Status.NumberAvailable != ds.Status.DesiredNumberScheduled {
		t.Errorf("kube-proxy: %s, %d of %d updated, %d available", ds.Spec.Template.Spec.Containers[0].Image, ds.Status.UpdatedNumberScheduled, ds.Status.DesiredNumberScheduled, ds.Status.NumberAvailable)
	}
}

// talosTarget is the Talos version TestTalosUpgrade upgrades to
// (ICHOR_KIND_TALOS_TO, default v1.14.1).
func talosTarget() string {
	if v := os.Getenv("ICHOR_KIND_TALOS_TO"); v != "" {
		return v
	}
	return "v1.14.1"
}

// bootWatch follows the nodes through a Talos upgrade, every half second:
// when each first reports the target in its osImage, how many nodes are
// cordoned at once, and how many etcd members (the real etcd static pods)
// are Ready.
type bootWatch struct {
	mu             sync.Mutex
	upgraded       []string // nodes in the order they reported the target
	maxCordoned    int
	maxCordonedCPs int
	minEtcdReady   int
}

func startBootWatch(ctx context.Context, want string) *bootWatch {
	b := &bootWatch{minEtcdReady: env.controlPlanes}
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			b.sample(ctx, want)
		}
	}()
	return b
}

func (b *bootWatch) sample(ctx context.Context, want string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nodes, err := env.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	etcd, err := env.client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "component=etcd"})
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cordoned, cordonedCPs := 0, 0
	for _, n := range nodes.Items {
		_, cp := n.Labels["node-role.kubernetes.io/control-plane"]
		if n.Spec.Unschedulable {
			cordoned++
			if cp {
				cordonedCPs++
			}
		}
		if n.Status.NodeInfo.OSImage == "Talos ("+want+")" && !slices.Contains(b.upgraded, n.Name) {
			b.upgraded = append(b.upgraded, n.Name)
		}
	}
	b.maxCordoned = max(b.maxCordoned, cordoned)
	b.maxCordonedCPs = max(b.maxCordonedCPs, cordonedCPs)
	ready := 0
	for _, p := range etcd.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready++
			}
		}
	}
	b.minEtcdReady = min(b.minEtcdReady, ready)
}

// containerStarts is when each node's container last started.
func containerStarts(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	nodes, err := env.provider.ListInternalNodes(env.name)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		b, err := exec.Command("docker", "inspect", "-f", "{{.State.StartedAt}}", n.String()).Output()
		if err != nil {
			t.Fatalf("docker inspect %s: %v", n.String(), err)
		}
		out[n.String()] = strings.TrimSpace(string(b))
	}
	return out
}

// TestTalosUpgrade upgrades Talos on every node through the Job: each node
// is drained, its machine installs the new version and reboots, and the
// reboot restarts the node's container (systemd, containerd, the kubelet and
// every pod start again); control planes first, one at a time, etcd keeping
// its quorum, the web Service always with a ready endpoint. Every node ends
// on the target (the Talos API's version and the Node's osImage), with a new
// boot, schedulable, its kubelet unchanged.
func TestTalosUpgrade(t *testing.T) {
	to := talosTarget()
	image := loadJobImage(t)
	ctx := context.Background()
	deployWeb(t, ctx)
	before := containerStarts(t)
	boots := map[string]string{}
	for _, m := range env.talos.Machines {
		boots[m.Name()] = m.State().BootID
	}
	kubelets := map[string]string{}
	nodes, err := env.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		kubelets[n.Name] = n.Status.NodeInfo.KubeletVersion
	}

	if _, err := ichor(t, 5*time.Minute, "plan", "talos", "--to", to); err != nil {
		t.Fatalf("plan: %v", err)
	}
	wctx, stop := context.WithCancel(ctx)
	w, b := startWatch(wctx), startBootWatch(wctx, to)
	start := time.Now()
	out, err := ichor(t, 45*time.Minute, "upgrade", "talos", "--to", to, "--yes", "--image", image)
	stop()
	if err != nil {
		t.Fatalf("upgrade talos %s -> %s: %v", talosVersion(), to, err)
	}
	if !strings.Contains(out, "Succeeded") {
		t.Errorf("upgrade: no Succeeded in its output")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	t.Logf("Talos %s -> %s in %s; order %v; at most %d node(s) cordoned at once (%d control planes); etcd members Ready at least %d of %d; web Service without a ready endpoint at most %s; runner pods %v",
		talosVersion(), to, time.Since(start).Round(time.Second), b.upgraded, b.maxCordoned, b.maxCordonedCPs, b.minEtcdReady, env.controlPlanes, w.longestNoReady, w.runners)
	if b.maxCordonedCPs > 1 {
		t.Errorf("%d control planes cordoned at once, want one at a time", b.maxCordonedCPs)
	}
	if quorum := env.controlPlanes/2 + 1; b.minEtcdReady < quorum {
		t.Errorf("etcd: %d of %d members Ready at one point, below the quorum of %d", b.minEtcdReady, env.controlPlanes, quorum)
	}
	for i, name := range b.upgraded {
		if i < env.controlPlanes && !strings.Contains(name, "control-plane") {
			t.Errorf("order %v: a worker before every control plane", b.upgraded)
			break
		}
	}
	if w.longestNoReady > 0 || !w.noReadySince.IsZero() {
		t.Errorf("the web Service had no ready endpoint for %s", w.longestNoReady)
	}
	for _, v := range w.violations {
		t.Errorf("invariant: %s", v)
	}

	after := containerStarts(t)
	for node, started := range before {
		if after[node] == started {
			t.Errorf("%s: its container did not restart (started %s)", node, started)
		}
	}
	for _, m := range env.talos.Machines {
		st := m.State()
		if st.TalosVersion != to || st.BootID == boots[m.Name()] {
			t.Errorf("%s: Talos %s, boot %s (was %s), want %s on a new boot", m.Name(), st.TalosVersion, st.BootID, boots[m.Name()], to)
		}
	}
	nodes, err = env.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if want := "Talos (" + to + ")"; n.Status.NodeInfo.OSImage != want {
			t.Errorf("%s: osImage %q, want %q", n.Name, n.Status.NodeInfo.OSImage, want)
		}
		if n.Spec.Unschedulable || !ready(n) {
			t.Errorf("node %s: unschedulable %t, ready %t", n.Name, n.Spec.Unschedulable, ready(n))
		}
		if n.Status.NodeInfo.KubeletVersion != kubelets[n.Name] {
			t.Errorf("%s: kubelet %s, was %s", n.Name, n.Status.NodeInfo.KubeletVersion, kubelets[n.Name])
		}
	}
	eventually(t, 2*time.Minute, func() error {
		for _, n := range nodes.Items {
			if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
				continue
			}
			cfg := rest.CopyConfig(env.config)
			cfg.Host = "https://" + internalIP(n) + ":6443"
			rc, err := rest.RESTClientFor(withNegotiated(cfg))
			if err != nil {
				return err
			}
			body, err := rc.Get().AbsPath("/readyz/etcd").DoRaw(context.Background())
			if err != nil || strings.TrimSpace(string(body)) != "ok" {
				return fmt.Errorf("%s: /readyz/etcd: %q %v", n.Name, body, err)
			}
		}
		return nil
	})
}

// withNegotiated gives a bare REST client the codecs it needs.
func withNegotiated(cfg *rest.Config) *rest.Config {
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.APIPath = "/api"
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return cfg
}
