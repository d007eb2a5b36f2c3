"""Layer 2: process groups and weight sync between trainers and generators.

`process_group` opens the sync group (its own TCPStore, gloo or nccl), `buckets` lays parameters out in flat
buckets, `weight_sync` pushes and receives versioned weights over the group and checksums them.
"""
