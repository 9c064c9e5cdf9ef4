module github.com/ichor-dev/kubectl-ichor

go 1.26.6

require (
	github.com/cosi-project/runtime v1.14.1 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/siderolabs/talos/pkg/machinery v1.13.9 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	k8s.io/api v0.36.3 // indirect
	k8s.io/apimachinery v0.36.3 // indirect
	k8s.io/cli-runtime v0.36.3 // indirect
	k8s.io/client-go v0.36.3 // indirect
	k8s.io/kubectl v0.36.3 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)
