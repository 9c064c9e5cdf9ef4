package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// deps are the clients commands build from flags; tests replace them with fakes.
type deps struct {
	// kube connects to the Kubernetes API the flags name.
	kube func(flags *genericclioptions.ConfigFlags) (*kubeTarget, error)
	// talos connects to the Talos API the flags name. A reader that is an io.Closer is closed.
	talos func(ctx context.Context, flags TalosFlags) (discovery.TalosReader, error)
	// job is what the commands of an operation (upgrade, status, logs, resume, abort, run) need.
	job jobDeps
}

// kubeTarget is a connected Kubernetes API.
type kubeTarget struct {
	client   kubernetes.Interface
	dynamic  dynamic.Interface
	endpoint string
	cluster  string
	metrics  checks.MetricsReader
}

func defaultDeps() deps {
	return deps{kube: connectKube, talos: connectTalos, job: defaultJobDeps()}
}

func connectKube(flags *genericclioptions.ConfigFlags) (*kubeTarget, error) {
	restConfig, err := restConfigOf(flags)
	if err != nil {
		return nil, err
	}

	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", restConfig.Host, err)
	}

	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", restConfig.Host, err)
	}

	return &kubeTarget{
		client:   client,
		dynamic:  dyn,
		endpoint: restConfig.Host,
		cluster:  clusterName(flags),
		metrics:  checks.RESTMetrics{Client: client.Discovery().RESTClient()},
	}, nil
}

// restConfigOf is the REST config of the cluster the kubeconfig flags name, at the
// plugin's client rates: the one place the operator's Kubernetes clients come from.
func restConfigOf(flags *genericclioptions.ConfigFlags) (*rest.Config, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w: pass --kubeconfig or --context, or set KUBECONFIG", err)
	}

	// With no kubeconfig at all (and not in a pod), client-go falls back to
	// http://localhost:8080.
	if raw, err := flags.ToRawKubeConfigLoader().RawConfig(); err == nil && len(raw.Clusters) == 0 &&
		(flags.APIServer == nil || *flags.APIServer == "") && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, errors.New("no kubeconfig found: pass --kubeconfig or --context, or set KUBECONFIG")
	}

	return withRates(cfg), nil
}

// clusterName is the kubeconfig's name for the cluster the flags select, "" when unknown.
func clusterName(flags *genericclioptions.ConfigFlags) string {
	if flags.ClusterName != nil && *flags.ClusterName != "" {
		return *flags.ClusterName
	}

	raw, err := flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return ""
	}

	name := raw.CurrentContext
	if flags.Context != nil && *flags.Context != "" {
		name = *flags.Context
	}

	if c, found := raw.Contexts[name]; found {
		return c.Cluster
	}

	return ""
}
