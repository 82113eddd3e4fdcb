"""relayer"""
