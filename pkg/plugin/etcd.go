package plugin

import (
	"github.com/spf13/cobra"
)

// addEtcdFlags adds the etcd flag of the Talos commands and makes them read
// etcd for the plan's etcd check.
func addEtcdFlags(cmd *cobra.Command, o *planOptions) {
	o.readEtcd = true
	cmd.Flags().BoolVar(&o.AllowEtcdOutage, "allow-etcd-outage", false,
		"Accept that a control plane's reboot stops a one- or two-member etcd (and the Kubernetes API) until it is back")
}
