"""The kubelet's pod-resources API (gRPC over a unix socket): pods and containers per GPU."""
