{{- /* Multi-router helpers (issue 18 item 3, docs/ROUTERS.md). */}}

{{- /* The DNS name of router pod i under the headless peers Service. Args: (dict "root" . "i" i) */}}
{{- define "tandem.routerPodHost" -}}
{{- $root := .root -}}
{{- printf "%s-router-%d.%s-router-peers.%s.svc.%s" (include "tandem.fullname" $root) (int .i) (include "tandem.fullname" $root) $root.Release.Namespace $root.Values.clusterDomain -}}
{{- end }}

{{- /* Every router's control address, comma-separated: the workers' --router (TANDEM_ROUTER); a
worker registers and heartbeats with each. */}}
{{- define "tandem.routerControlAddresses" -}}
{{- $root := . -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.router.replicas) -}}
{{- $addrs = append $addrs (printf "tcp://%s:%v" (include "tandem.routerPodHost" (dict "root" $root "i" $i)) $root.Values.router.ports.control) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end }}

{{- /* The routers as ID=ENDPOINT, comma-separated: every router's --peers (TANDEM_PEERS; a router
skips its own entry, its id being its pod name, TANDEM_ROUTER_ID). */}}
{{- define "tandem.routerPeers" -}}
{{- $root := . -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.router.replicas) -}}
{{- $peers = append $peers (printf "%s-router-%d=tcp://%s:%v" (include "tandem.fullname" $root) $i (include "tandem.routerPodHost" (dict "root" $root "i" $i)) $root.Values.router.ports.control) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end }}
