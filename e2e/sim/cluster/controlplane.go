package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Control-plane constants, as a Talos cluster has them.
const (
	serviceCIDR  = "10.96.0.0/12"
	serviceIP    = "10.96.0.1"
	clusterCIDR  = "10.244.0.0/16"
	apiPort      = 6443
	etcdPort     = 2379
	etcdPeerPort = 2380
	kcmPort      = 10257
	schedPort    = 10259
)

// controlPlane is the real Kubernetes control plane of a local cluster:
// etcd, kube-apiserver, kube-controller-manager and kube-scheduler, each a
// child process of the cluster daemon.
type controlPlane struct {
	procs      []*process
	restConfig *rest.Config
	client     kubernetes.Interface
	// kubeletClient is the apiserver's client certificate for kubelets; the
	// simulated kubelets' log endpoints trust the CA that signed it.
	caPEM []byte
	// etcdURL is the client URL of the real etcd.
	etcdURL string

	// apiserver is the kube-apiserver's index in procs, bin, args and logs
	// what starts it again after the apiServerDown fault; down says the fault
	// stopped it (alive does not count that as a failure).
	apiserver     int
	apiserverBin  string
	apiserverArgs []string
	logs          string
	down          bool
}

func (c *controlPlane) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(10 * time.Second)
	}
}

func startControlPlane(ctx context.Context, opts Options, addrs addressPlan, g *generated) (cp *controlPlane, err error) {
	pki := filepath.Join(opts.Dir, "pki")
	logs := filepath.Join(opts.Dir, "logs")
	for _, d := range []string{pki, logs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	k8sCA, err := parseCA(g.bundle.Certs.K8s.Crt, g.bundle.Certs.K8s.Key)
	if err != nil {
		return nil, fmt.Errorf("kubernetes CA: %w", err)
	}
	aggCA, err := parseCA(g.bundle.Certs.K8sAggregator.Crt, g.bundle.Certs.K8sAggregator.Key)
	if err != nil {
		return nil, fmt.Errorf("aggregator CA: %w", err)
	}
	ip := addrs.apiServer()
	host := ip.String()
	server := fmt.Sprintf("https://%s:%d", host, apiPort)

	files := map[string][]byte{
		"ca.crt":             k8sCA.certPEM,
		"ca.key":             g.bundle.Certs.K8s.Key,
		"front-proxy-ca.crt": aggCA.certPEM,
		"sa.key":             g.bundle.Certs.K8sServiceAccount.Key,
	}
	issue := func(name string, c *ca, cn string, orgs []string, ips []net.IP, dns []string, srv, cli bool) error {
		l, err := c.issue(cn, orgs, ips, dns, srv, cli)
		if err != nil {
			return err
		}
		files[name+".crt"], files[name+".key"] = l.CertPEM, l.KeyPEM
		return nil
	}
	for _, e := range []error{
		issue("apiserver", k8sCA, "kube-apiserver", nil,
			[]net.IP{net.ParseIP(host), net.ParseIP(serviceIP), net.ParseIP("127.0.0.1")},
			[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}, true, false),
		issue("apiserver-kubelet-client", k8sCA, "apiserver-kubelet-client", []string{"system:masters"}, nil, nil, false, true),
		issue("front-proxy-client", aggCA, "front-proxy-client", nil, nil, nil, false, true),
		issue("admin", k8sCA, "admin", []string{"system:masters"}, nil, nil, false, true),
		issue("controller-manager", k8sCA, "system:kube-controller-manager", nil, nil, nil, false, true),
		issue("scheduler", k8sCA, "system:kube-scheduler", nil, nil, nil, false, true),
		issue("serving", k8sCA, host, nil, []net.IP{net.ParseIP(host)}, []string{"localhost"}, true, false),
	} {
		if e != nil {
			return nil, e
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(pki, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	// Kubeconfigs in the shape Talos' Kubeconfig API generates (one cluster,
	// user and context, named <user>@<cluster>, namespace default): talosctl
	// refuses any other shape for the admin kubeconfig it downloads.
	writeKubeconfig := func(path, user string) error {
		name := user + "@" + opts.Name
		return clientcmd.WriteToFile(clientcmdapi.Config{
			Clusters: map[string]*clientcmdapi.Cluster{opts.Name: {Server: server, CertificateAuthorityData: k8sCA.certPEM}},
			AuthInfos: map[string]*clientcmdapi.AuthInfo{name: {
				ClientCertificateData: files[user+".crt"], ClientKeyData: files[user+".key"],
			}},
			Contexts:       map[string]*clientcmdapi.Context{name: {Cluster: opts.Name, AuthInfo: name, Namespace: "default"}},
			CurrentContext: name,
		}, path)
	}
	adminKubeconfig := filepath.Join(opts.Dir, "kubeconfig")
	for _, kc := range []struct{ path, user string }{
		{adminKubeconfig, "admin"},
		{filepath.Join(pki, "controller-manager.kubeconfig"), "controller-manager"},
		{filepath.Join(pki, "scheduler.kubeconfig"), "scheduler"},
	} {
		if err := writeKubeconfig(kc.path, kc.user); err != nil {
			return nil, fmt.Errorf("write %s: %w", kc.path, err)
		}
	}
	p := func(name string) string { return filepath.Join(pki, name) }
	bin := func(name string) string { return filepath.Join(opts.BinDir, name) }

	cp = &controlPlane{caPEM: k8sCA.certPEM}
	defer func() {
		if err != nil {
			cp.stop()
		}
	}()
	etcdURL := fmt.Sprintf("http://%s:%d", host, etcdPort)
	cp.etcdURL = etcdURL
	etcd, err := startProcess("etcd", logs, bin("etcd"),
		"--name=ichor-sim", "--data-dir="+filepath.Join(opts.Dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://%s:%d", host, etcdPeerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://%s:%d", host, etcdPeerPort),
		fmt.Sprintf("--initial-cluster=ichor-sim=http://%s:%d", host, etcdPeerPort),
		"--listen-metrics-urls=", "--unsafe-no-fsync", "--log-level=warn",
		"--quota-backend-bytes=4294967296",
	)
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, etcd)

	cp.logs, cp.apiserverBin = logs, bin("kube-apiserver")
	cp.apiserverArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + host, "--advertise-address=" + host, fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir=" + pki, "--tls-cert-file=" + p("apiserver.crt"), "--tls-private-key-file=" + p("apiserver.key"),
		"--client-ca-file=" + p("ca.crt"),
		"--kubelet-client-certificate=" + p("apiserver-kubelet-client.crt"), "--kubelet-client-key=" + p("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--requestheader-client-ca-file=" + p("front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p("front-proxy-client.crt"), "--proxy-client-key-file=" + p("front-proxy-client.key"),
		"--service-account-key-file=" + p("sa.key"), "--service-account-signing-key-file=" + p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", "--endpoint-reconciler-type=none",
		"--profiling=false", "--v=1",
	}
	apiserver, err := startProcess("kube-apiserver", logs, cp.apiserverBin, cp.apiserverArgs...)
	if err != nil {
		return nil, err
	}
	cp.apiserver = len(cp.procs)
	cp.procs = append(cp.procs, apiserver)

	cp.restConfig, err = clientcmd.BuildConfigFromFlags("", adminKubeconfig)
	if err != nil {
		return nil, err
	}
	// Real kubelets each have a client of their own; the simulated ones
	// share this one, so its rate grows with them (a Lease renewal every 10s
	// each is machines/10 requests a second).
	machines := opts.ControlPlanes + opts.Workers
	cp.restConfig.QPS = float32(max(500, machines/4))
	cp.restConfig.Burst = 2 * int(cp.restConfig.QPS)
	cp.client, err = kubernetes.NewForConfig(cp.restConfig)
	if err != nil {
		return nil, err
	}
	if err := waitFor(ctx, "kube-apiserver", 90*time.Second, apiserver, func(ctx context.Context) error {
		return cp.client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
	}); err != nil {
		return nil, err
	}

	kcm, err := startProcess("kube-controller-manager", logs, bin("kube-controller-manager"), withAPIRate(machines, 20, 30,
		"--kubeconfig="+p("controller-manager.kubeconfig"),
		"--authentication-kubeconfig="+p("controller-manager.kubeconfig"),
		"--authorization-kubeconfig="+p("controller-manager.kubeconfig"),
		"--bind-address="+host, fmt.Sprintf("--secure-port=%d", kcmPort),
		"--tls-cert-file="+p("serving.crt"), "--tls-private-key-file="+p("serving.key"),
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"),
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+p("ca.crt"), "--cluster-signing-key-file="+p("ca.key"),
		"--cluster-cidr="+clusterCIDR, "--allocate-node-cidrs=true", "--service-cluster-ip-range="+serviceCIDR,
		"--leader-elect=false", "--flex-volume-plugin-dir="+filepath.Join(opts.Dir, "flexvolume"),
		"--profiling=false", "--v=1",
	)...)
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, kcm)
	sched, err := startProcess("kube-scheduler", logs, bin("kube-scheduler"), withAPIRate(machines, 50, 100,
		"--kubeconfig="+p("scheduler.kubeconfig"),
		"--authentication-kubeconfig="+p("scheduler.kubeconfig"),
		"--authorization-kubeconfig="+p("scheduler.kubeconfig"),
		"--bind-address="+host, fmt.Sprintf("--secure-port=%d", schedPort),
		"--tls-cert-file="+p("serving.crt"), "--tls-private-key-file="+p("serving.key"),
		"--leader-elect=false", "--profiling=false", "--v=1",
	)...)
	if err != nil {
		return nil, err
	}
	cp.procs = append(cp.procs, sched)
	return cp, nil
}

// withAPIRate is a controller's arguments with its --kube-api-qps and
// --kube-api-burst for a cluster of machines: none (its defaults, qps and
// burst) until a request a second per 50 machines is more, then that (the
// DaemonSet controller creates a pod per node, the scheduler binds it), as
// large clusters raise them.
func withAPIRate(machines, qps, burst int, args ...string) []string {
	if machines/50 <= qps {
		return args
	}
	return append(args, fmt.Sprintf("--kube-api-qps=%d", machines/50), fmt.Sprintf("--kube-api-burst=%d", max(burst, 3*machines/100)))
}

// followAPIServerFault stops the kube-apiserver when down is set (the
// apiServerDown fault: SIGTERM, then SIGKILL after 10s, as a static pod's
// restart does) and starts it again, with the same arguments, once it is
// cleared. It does not wait for the apiserver to be ready: its clients find
// out, as they would in a cluster.
func (c *controlPlane) followAPIServerFault(down bool, log *slog.Logger) error {
	switch {
	case down && !c.down:
		log.Info("stopping the kube-apiserver (fault)")
		c.procs[c.apiserver].stop(10 * time.Second)
		c.down = true
	case !down && c.down:
		log.Info("starting the kube-apiserver again (fault cleared)")
		p, err := startProcess("kube-apiserver", c.logs, c.apiserverBin, c.apiserverArgs...)
		if err != nil {
			return err
		}
		c.procs[c.apiserver], c.down = p, false
	}
	return nil
}

// alive returns the error of the first control-plane process that ended
// (the kube-apiserver stopped by the apiServerDown fault aside).
func (c *controlPlane) alive() error {
	for i, p := range c.procs {
		if i == c.apiserver && c.down {
			continue
		}
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}
