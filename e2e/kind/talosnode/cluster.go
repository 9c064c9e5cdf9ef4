package talosnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/manifests"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/talosaccess"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/talosapi"
)

// Options describe the kind cluster to make Talos nodes of.
type Options struct {
	// Name is the cluster's name (in the machine configs).
	Name string
	// Nodes are the cluster's nodes; the first control plane bootstraps
	// the manifests.
	Nodes []Node
	// Endpoint is the cluster endpoint, e.g. https://172.18.0.2:6443.
	Endpoint string
	// TalosVersion is the Talos version the machines run, e.g. v1.13.9.
	TalosVersion string
	// KubernetesVersion is the version the cluster runs, e.g. v1.35.4.
	KubernetesVersion string
	// CoreDNSImage is the CoreDNS image the node image carries.
	CoreDNSImage string
	// PodSubnet and ServiceSubnet are the cluster's (kind's defaults:
	// 10.244.0.0/16 and 10.96.0.0/16).
	PodSubnet, ServiceSubnet string
	// AdminKubeconfig is what the Kubeconfig call returns.
	AdminKubeconfig []byte
	// RestConfig reaches the cluster's apiserver.
	RestConfig *rest.Config
	// Dir receives the talosconfig.
	Dir string
	// Log receives the machines' diagnostics; nil discards them.
	Log *slog.Logger
}

// Cluster is a kind cluster whose nodes are Talos machines.
type Cluster struct {
	// Talosconfig is the path of an admin talosconfig whose endpoints are
	// the control planes.
	Talosconfig string
	// Machines are the nodes' machines, in Options.Nodes order.
	Machines []*machine.Machine

	api       *talosapi.Server
	kubePrism map[string]*kubePrism
	log       *slog.Logger
	ctx       context.Context //nolint:containedctx // the lifetime of the listeners
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// KubePrismPort is the port Talos' KubePrism listens on by default.
const KubePrismPort = 7445

// Start makes the kind cluster's nodes Talos nodes (see the package
// documentation) and applies the bootstrap manifests. The cluster stays so
// until Stop.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	client, err := kubernetes.NewForConfig(opts.RestConfig)
	if err != nil {
		return nil, err
	}
	g, err := generateConfigs(opts)
	if err != nil {
		return nil, err
	}
	c = &Cluster{Talosconfig: filepath.Join(opts.Dir, "talosconfig"), log: log}
	if err := g.talosconfig.Save(c.Talosconfig); err != nil {
		return nil, fmt.Errorf("write talosconfig: %w", err)
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.ctx = ctx
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	// The kubelet reports the OS in the Node's osImage from os-release, read
	// when it starts.
	if err := forEach(opts.Nodes, func(n Node) error {
		return writeOSRelease(ctx, n.Name, opts.TalosVersion)
	}); err != nil {
		return nil, fmt.Errorf("os-release: %w", err)
	}

	discovery := machine.NewDiscovery()
	var controlPlanes []string
	for _, n := range opts.Nodes {
		m, err := machine.New(machine.Options{
			Name:            n.Name,
			IP:              n.IP,
			ControlPlane:    n.ControlPlane,
			TalosVersion:    opts.TalosVersion,
			Config:          g.configs[n.Name],
			AdminKubeconfig: opts.AdminKubeconfig,
			Discovery:       discovery,
			PowerCycle: func(ctx context.Context) error {
				return c.powerCycle(ctx, n)
			},
			Log: log,
		})
		if err != nil {
			return nil, err
		}
		c.Machines = append(c.Machines, m)
		if n.ControlPlane {
			controlPlanes = append(controlPlanes, n.IP.String())
		}
	}
	c.api, err = talosapi.Start(ctx, talosapi.Options{
		Machines: c.Machines,
		CACert:   g.bundle.Certs.OS.Crt,
		CAKey:    g.bundle.Certs.OS.Key,
		Listen: func(m *machine.Machine, addr string) (net.Listener, error) {
			return listenIn(ctx, m.Name(), addr)
		},
		Log: log,
	})
	if err != nil {
		return nil, fmt.Errorf("talos API: %w", err)
	}
	c.kubePrism = map[string]*kubePrism{}
	for _, n := range opts.Nodes {
		p := &kubePrism{node: n.Name, controlPlanes: controlPlanes, log: log.With("node", n.Name)}
		if err := p.open(ctx); err != nil {
			return nil, err
		}
		c.kubePrism[n.Name] = p
	}
	applier, err := manifests.NewApplier(opts.RestConfig, log)
	if err != nil {
		return nil, err
	}
	if err := applier.Apply(ctx, c.Machines[0]); err != nil {
		return nil, fmt.Errorf("bootstrap manifests: %w", err)
	}
	var cps []*machine.Machine
	for _, m := range c.Machines {
		if m.ControlPlane() {
			cps = append(cps, m)
		}
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		applier.Watch(ctx, cps)
	}()
	if err := talosService(ctx, client, controlPlanes); err != nil {
		return nil, fmt.Errorf("talos Service: %w", err)
	}
	if err := talosaccess.Start(ctx, opts.RestConfig, g.bundle, c.Machines[0], log); err != nil {
		return nil, fmt.Errorf("talos API access: %w", err)
	}
	// The control planes' static pods become Talos' one node at a time (a
	// rewritten manifest restarts the pod): the apiserver never goes down
	// on every node at once.
	for _, m := range c.Machines {
		d := newNode(m, client, opts.TalosVersion, opts.KubernetesVersion, log)
		if m.ControlPlane() {
			if err := d.sync(ctx); err != nil {
				return nil, err
			}
			if err := waitStaticPods(ctx, client, m.Name(), 5*time.Minute); err != nil {
				return nil, err
			}
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			d.run(ctx)
		}()
	}
	return c, nil
}

// waitStaticPods waits until a control plane's three mirror pods carry
// Talos' k8s-app label and are Ready.
func waitStaticPods(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		pods, err := client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{
			LabelSelector: "k8s-app in (kube-apiserver,kube-controller-manager,kube-scheduler)",
			FieldSelector: "spec.nodeName=" + node,
		})
		if err == nil {
			ready := 0
			for _, p := range pods.Items {
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			if ready == 3 && len(pods.Items) == 3 {
				return nil
			}
			err = fmt.Errorf("%d of 3 static pods ready", ready)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("static pods of %s: %w (last: %v)", node, ctx.Err(), last)
		case <-time.After(2 * time.Second):
		}
	}
}

// Stop stops the Talos API, KubePrism and the machines; the kind cluster
// keeps running.
func (c *Cluster) Stop() {
	c.cancel()
	if c.api != nil {
		c.api.Stop()
	}
	c.wg.Wait()
	for _, m := range c.Machines {
		m.Close()
	}
}

// talosService is Talos' talos Service in the default namespace: the Talos
// API of every control plane, for pods (the plugin's Job among them).
func talosService(ctx context.Context, client kubernetes.Interface, controlPlanes []string) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "talos", Namespace: metav1.NamespaceDefault},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "apid", Port: constants.ApidPort, TargetPort: intstr.FromInt32(constants.ApidPort), Protocol: corev1.ProtocolTCP,
		}}},
	}
	if _, err := client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	port := int32(constants.ApidPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "talos", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{discoveryv1.LabelServiceName: "talos", discoveryv1.LabelManagedBy: "talos.dev"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("apid"), Port: &port, Protocol: new(corev1.ProtocolTCP)}},
	}
	for _, ip := range controlPlanes {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: new(true)}})
	}
	if _, err := client.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// kubePrism is Talos' KubePrism on one node: 127.0.0.1:7445 in the node's
// network namespace forwards each connection to the first control plane
// apiserver that accepts it, starting from the next one each time.
type kubePrism struct {
	node          string
	controlPlanes []string
	log           *slog.Logger
	next          atomic.Uint64

	mu  sync.Mutex
	lis net.Listener
}

// open listens in the node's current network namespace (a restarted
// container has a new one), closing the listener of the previous one.
func (p *kubePrism) open(ctx context.Context) error {
	lis, err := listenIn(ctx, p.node, net.JoinHostPort("127.0.0.1", strconv.Itoa(KubePrismPort)))
	if err != nil {
		return fmt.Errorf("KubePrism: %w", err)
	}
	p.mu.Lock()
	old := p.lis
	p.lis = lis
	p.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	context.AfterFunc(ctx, func() { _ = lis.Close() })
	go p.serve(ctx, lis)
	return nil
}

func (p *kubePrism) serve(ctx context.Context, lis net.Listener) {
	for {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				p.log.Warn("KubePrism", "err", err)
			}
			return
		}
		go p.forward(ctx, conn)
	}
}

func (p *kubePrism) forward(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	start := p.next.Add(1)
	for i := range p.controlPlanes {
		addr := net.JoinHostPort(p.controlPlanes[(int(start)+i)%len(p.controlPlanes)], "6443")
		up, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			continue
		}
		defer up.Close()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
		go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
		select {
		case <-done:
		case <-ctx.Done():
		}
		return
	}
}

// powerCycle restarts the node's container (systemd, containerd, the kubelet
// and every pod start again, as after a reboot) and reopens KubePrism in its
// new network namespace. The node must come back on its address: the
// machine, its certificates and the cluster know it by it.
func (c *Cluster) powerCycle(ctx context.Context, n Node) error {
	// As Talos' reboot sequence does before it reboots (StopAllPods): the
	// kubelet stopped, then every container asked to stop (apiservers leave
	// the kubernetes Service's endpoints on the way), not killed with the
	// node.
	if _, err := Exec(ctx, n.Name, nil, "sh", "-c", `systemctl stop kubelet
running() { ctr -n k8s.io tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING" { print $1 }'; }
for id in $(running); do ctr -n k8s.io tasks kill --signal SIGTERM "$id" > /dev/null 2>&1; done
for i in $(seq 30); do
  [ -z "$(running)" ] && exit 0
  sleep 1
done
echo "containers still running after 30 s: $(running | tr '\n' ' ')" >&2
exit 1`); err != nil {
		c.log.Warn("stopping the pods before the power cycle", "node", n.Name, "err", err)
	}
	if _, err := docker(ctx, nil, "restart", "--time", "30", n.Name); err != nil {
		return err
	}
	ip, err := docker(ctx, nil, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", n.Name)
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(string(ip)); got != n.IP.String() {
		return fmt.Errorf("%s came back on %s, not %s", n.Name, got, n.IP)
	}
	if p := c.kubePrism[n.Name]; p != nil {
		return p.open(c.ctx)
	}
	return nil
}

// forEach runs fn for every node at once and returns the first error.
func forEach(nodes []Node, fn func(Node) error) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = fn(n) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
