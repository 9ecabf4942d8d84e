"""What the contract decides, written once for both stores."""
