"""The main's control plane (:8443, mutual TLS): enrolled nodes and paired controllers."""
