package machine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// manifestTemplate is one bootstrap manifest: a Manifest resource ID, its
// template and whether the config renders it.
type manifestTemplate struct {
	id   string
	text string
	when func(manifestData) bool
}

// manifestTemplates are the bootstrap manifests a simulated control plane
// renders, by Manifest resource ID. Their shape follows Talos' templates
// (kube-proxy DaemonSet in kube-system labelled k8s-app=kube-proxy and
// tolerating everything, CoreDNS with two replicas behind the kube-dns
// Service on the cluster DNS IP), written for the simulator.
func manifestTemplates() []manifestTemplate {
	return []manifestTemplate{
		{id: "10-kube-proxy", when: func(d manifestData) bool { return d.ProxyEnabled }, text: kubeProxyTemplate},
		{id: "11-core-dns", when: func(d manifestData) bool { return d.CoreDNSEnabled }, text: coreDNSTemplate},
		{id: "11-core-dns-svc", when: func(d manifestData) bool { return d.CoreDNSEnabled }, text: coreDNSServiceTemplate},
		{id: "11-kube-config-in-cluster", when: func(manifestData) bool { return true }, text: kubeconfigInClusterTemplate},
	}
}

type manifestData struct {
	ProxyEnabled   bool
	ProxyImage     string
	ProxyMode      string
	ProxyArgs      []string
	PodCIDRs       string
	CoreDNSEnabled bool
	CoreDNSImage   string
	DNSServiceIP   string
	DNSDomain      string
	// Server is the apiserver kube-proxy reaches through the
	// kubeconfig-in-cluster ConfigMap: KubePrism on the node when it is
	// enabled (Talos' default), the cluster endpoint otherwise, as Talos'
	// BootstrapManifestsConfig has it.
	Server string
}

func newManifestData(cfg config.Config) (manifestData, error) {
	proxy, coreDNS, net := cfg.K8sProxyConfig(), cfg.K8sCoreDNSConfig(), clusterNetwork(cfg)
	d := manifestData{
		ProxyEnabled:   proxy != nil && proxy.Enabled(),
		PodCIDRs:       strings.Join(net.PodCIDRs, ","),
		CoreDNSEnabled: coreDNS != nil && coreDNS.Enabled(),
		DNSDomain:      net.DNSDomain,
		Server:         clusterEndpoint(cfg),
	}
	if prism := cfg.K8sKubePrismConfig(); prism != nil {
		d.Server = fmt.Sprintf("https://127.0.0.1:%d", prism.Port())
	}
	if d.ProxyEnabled {
		d.ProxyImage, d.ProxyMode = proxy.Image(), proxy.Mode()
		for k, vs := range proxy.ExtraArgs() {
			for _, v := range vs {
				d.ProxyArgs = append(d.ProxyArgs, fmt.Sprintf("--%s=%s", k, v))
			}
		}
	}
	if d.CoreDNSEnabled {
		d.CoreDNSImage = coreDNS.Image()
		ip, err := dnsServiceIP(net)
		if err != nil {
			return d, err
		}
		d.DNSServiceIP = ip
	}
	return d, nil
}

// renderManifests renders the bootstrap manifests for cfg: manifest ID ->
// objects, as the maps Talos puts in Manifest resources, IDs sorted as Talos
// lists them. Besides its own templates, a control plane renders the user's
// manifests as Talos' ExtraManifestController does: each inline manifest
// (cluster.inlineManifests, KubeInlineManifestConfig) and each extra manifest
// (cluster.extraManifests, KubeExternalManifestConfig, fetched with fetch)
// becomes Manifest "99-<name>" (the name of an extraManifests URL is the
// URL), after every default one. A URL that cannot be fetched is in failed:
// Talos keeps its last render and retries.
func renderManifests(cfg config.Config, fetch fetchFunc) (ids []string, objects map[string][]map[string]any, failed map[string]error, err error) {
	data, err := newManifestData(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	objects = map[string][]map[string]any{}
	for _, t := range manifestTemplates() {
		if !t.when(data) {
			continue
		}
		tmpl, err := template.New(t.id).Parse(t.text)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("manifest %s: %w", t.id, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, nil, nil, fmt.Errorf("manifest %s: %w", t.id, err)
		}
		if objects[t.id], err = parseManifest(buf.Bytes()); err != nil {
			return nil, nil, nil, fmt.Errorf("manifest %s: %w", t.id, err)
		}
		ids = append(ids, t.id)
	}
	for _, m := range cfg.K8sExternalManifestConfigs() {
		id := userManifestPriority + "-" + m.Name()
		body, err := fetch(m.URL(), m.Headers())
		if err == nil {
			objects[id], err = parseManifest(body)
		}
		if err != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[id] = fmt.Errorf("extra manifest %q: %w", m.URL(), err)
			continue
		}
		ids = append(ids, id)
	}
	for _, m := range cfg.K8sInlineManifestConfigs() {
		id := userManifestPriority + "-" + m.Name()
		if objects[id], err = parseManifest([]byte(m.Contents())); err != nil {
			return nil, nil, nil, fmt.Errorf("inline manifest %q: %w", m.Name(), err)
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return slices.Compact(ids), objects, failed, nil
}

// userManifestPriority is the ID prefix of the user's manifests: Talos puts
// them last ("make sure extra manifests come last").
const userManifestPriority = "99"

// fetchFunc fetches an extra manifest's URL with its headers.
type fetchFunc func(url string, headers map[string]string) ([]byte, error)

// fetchManifest gets url over HTTP with headers, as Talos' go-getter does for
// an extra manifest, within a bound.
func fetchManifest(url string, headers map[string]string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range headers {
		req.Header.Add(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bad response code: %d", resp.StatusCode)
	}
	return io.ReadAll(resp.Body)
}

// parseManifest splits multi-document YAML into objects as Talos does: empty
// and comment-only documents are dropped, a List is unwrapped into its items.
func parseManifest(b []byte) ([]map[string]any, error) {
	var out []map[string]any
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		doc = bytes.TrimSpace(doc)
		if len(doc) == 0 {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, err
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if !u.IsList() {
			out = append(out, obj)
			continue
		}
		if err := u.EachListItem(func(item runtime.Object) error {
			out = append(out, item.(*unstructured.Unstructured).Object)
			return nil
		}); err != nil {
			return nil, err
		}
	}
}

const kubeProxyTemplate = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kube-proxy
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
- kind: ServiceAccount
  name: kube-proxy
  namespace: kube-system
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    tier: node
    k8s-app: kube-proxy
spec:
  selector:
    matchLabels:
      tier: node
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        tier: node
        k8s-app: kube-proxy
    spec:
      priorityClassName: system-node-critical
      hostNetwork: true
      serviceAccountName: kube-proxy
      tolerations:
      - operator: Exists
      containers:
      - name: kube-proxy
        image: {{ .ProxyImage }}
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --cluster-cidr={{ .PodCIDRs }}
        - --hostname-override=$(NODE_NAME)
        - --kubeconfig=/etc/kubernetes/kubeconfig
        - --proxy-mode={{ .ProxyMode }}
        - --conntrack-max-per-core=0
{{- range .ProxyArgs }}
        - {{ . }}
{{- end }}
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        securityContext:
          privileged: true
        volumeMounts:
        - name: kubeconfig
          mountPath: /etc/kubernetes
          readOnly: true
        - name: lib-modules
          mountPath: /lib/modules
          readOnly: true
      volumes:
      - name: kubeconfig
        configMap:
          name: kubeconfig-in-cluster
      - name: lib-modules
        hostPath:
          path: /lib/modules
`

const coreDNSTemplate = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
  labels:
    kubernetes.io/bootstrapping: rbac-defaults
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
  annotations:
    rbac.authorization.kubernetes.io/autoupdate: "true"
  labels:
    kubernetes.io/bootstrapping: rbac-defaults
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |-
    .:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        log . {
            class error
        }
        prometheus :9153
        kubernetes {{ .DNSDomain }} in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        forward . /etc/resolv.conf {
            max_concurrent 1000
        }
        cache 30
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/name: CoreDNS
spec:
  replicas: 2
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector:
                matchExpressions:
                - key: k8s-app
                  operator: In
                  values: [kube-dns]
              topologyKey: kubernetes.io/hostname
      tolerations:
      - key: node-role.kubernetes.io/control-plane
        operator: Exists
        effect: NoSchedule
      - key: node.cloudprovider.kubernetes.io/uninitialized
        operator: Exists
        effect: NoSchedule
      nodeSelector:
        kubernetes.io/os: linux
      containers:
      - name: coredns
        image: {{ .CoreDNSImage }}
        imagePullPolicy: IfNotPresent
        args: [-conf, /etc/coredns/Corefile]
        resources:
          limits:
            memory: 170Mi
          requests:
            cpu: 100m
            memory: 70Mi
        volumeMounts:
        - name: config-volume
          mountPath: /etc/coredns
          readOnly: true
        ports:
        - name: dns
          containerPort: 53
          protocol: UDP
        - name: dns-tcp
          containerPort: 53
          protocol: TCP
        - name: metrics
          containerPort: 9153
          protocol: TCP
        livenessProbe:
          httpGet:
            path: /health
            port: 8080
            scheme: HTTP
          initialDelaySeconds: 60
          timeoutSeconds: 5
          successThreshold: 1
          failureThreshold: 5
        readinessProbe:
          httpGet:
            path: /ready
            port: 8181
            scheme: HTTP
        securityContext:
          allowPrivilegeEscalation: false
          capabilities:
            add: [NET_BIND_SERVICE]
            drop: [all]
          readOnlyRootFilesystem: true
      dnsPolicy: Default
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items:
          - key: Corefile
            path: Corefile
`

const coreDNSServiceTemplate = `apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/cluster-service: "true"
    kubernetes.io/name: CoreDNS
  annotations:
    prometheus.io/port: "9153"
    prometheus.io/scrape: "true"
spec:
  selector:
    k8s-app: kube-dns
  clusterIP: {{ .DNSServiceIP }}
  ports:
  - name: dns
    port: 53
    protocol: UDP
  - name: dns-tcp
    port: 53
    protocol: TCP
  - name: metrics
    port: 9153
    protocol: TCP
`

const kubeconfigInClusterTemplate = `apiVersion: v1
kind: ConfigMap
metadata:
  name: kubeconfig-in-cluster
  namespace: kube-system
data:
  kubeconfig: |
    apiVersion: v1
    kind: Config
    clusters:
    - name: local
      cluster:
        server: {{ .Server }}
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    users:
    - name: service-account
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
    contexts:
    - context:
        cluster: local
        user: service-account
      name: local
    current-context: local
`
