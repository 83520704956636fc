"""rdmakit.transport"""
